"""``python -m autockpt``: the same command line as the ``autockpt`` script."""

import sys

from autockpt.cli import main

sys.exit(main())
