"""``python -m replay.cli``: the ``kvtrace`` command."""

from replay.cli import main

main(prog_name="kvtrace")
