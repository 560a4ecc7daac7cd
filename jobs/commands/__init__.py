"""The commands: the ``commitpub`` command line (:mod:`~jobs.commands.cli`), the operator's
commands (:mod:`~jobs.commands.ops`, :mod:`~jobs.commands.rename`) and the demo."""
