"""One module per command; COMMANDS is what the CLI registers."""

from memtrack.commands.doctor import doctor
from memtrack.commands.history import history
from memtrack.commands.ingest import ingest
from memtrack.commands.run import run
from memtrack.commands.show import show

COMMANDS = [run, history, show, ingest, doctor]
