"""``python -m mutation``: see mutation/runner.py."""

import sys

from .runner import main

sys.exit(main())
