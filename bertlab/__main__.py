"""`python -m bertlab ...`: the same as the `bertlab` command."""

import sys

from bertlab.cli import main

sys.exit(main())
