"""``python -m autosearch.cli``: how torchrun starts each process of a command."""

import sys

from autosearch.cli import main

if __name__ == "__main__":
    sys.exit(main())
