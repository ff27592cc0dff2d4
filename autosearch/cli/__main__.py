"""``python -m autosearch.cli``: how torchrun starts each process of a command."""

import sys

from autosearch.cli import main

sys.exit(main())
