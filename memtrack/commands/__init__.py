"""One module per command; COMMANDS is what the CLI registers."""

from memtrack.commands.backup import backup, export
from memtrack.commands.check import check
from memtrack.commands.dashboard import dashboard
from memtrack.commands.doctor import doctor
from memtrack.commands.estimate import estimate
from memtrack.commands.history import history
from memtrack.commands.ingest import ingest
from memtrack.commands.init import init
from memtrack.commands.plan import plan
from memtrack.commands.reference import reference
from memtrack.commands.run import run
from memtrack.commands.show import show
from memtrack.commands.snapshot import snapshot

COMMANDS = [init, run, estimate, plan, reference, check, history, show, snapshot, ingest, doctor,
            backup, export, dashboard]
