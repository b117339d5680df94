"""``python -m chexpercept``: the ``chexpercept`` command (the same program: its commands, its
handling of signals and standard streams)."""

import sys

from chexpercept.cli import main

if __name__ == "__main__":
    sys.exit(main())
