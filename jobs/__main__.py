"""``python -m jobs``: the ``commitpub`` command line."""

from jobs.cli import main

main(prog_name="commitpub")
