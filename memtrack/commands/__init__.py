"""One module per command; COMMANDS is what the CLI registers."""

from memtrack.commands.backup import backup, export
from memtrack.commands.check import check
from memtrack.commands.dashboard import dashboard
from memtrack.commands.doctor import doctor
from memtrack.commands.history import history
from memtrack.commands.ingest import ingest
from memtrack.commands.plan import plan
from memtrack.commands.run import run
from memtrack.commands.show import show

COMMANDS = [run, check, plan, history, show, ingest, doctor, backup, export, dashboard]
