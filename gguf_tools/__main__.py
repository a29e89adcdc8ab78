"""``python -m gguf_tools``."""

import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
