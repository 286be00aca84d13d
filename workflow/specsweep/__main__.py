"""`python -m specsweep ...` is the same as the `specsweep` command."""

import sys

from specsweep.cli import main

sys.exit(main())
