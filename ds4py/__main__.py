"""``python -m ds4py``: the command line (ds4py/cli.py)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
