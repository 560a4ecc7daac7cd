"""``python -m jobs``: the ``commitpub`` command line."""

from jobs.commands.cli import main

main(prog_name="commitpub")
