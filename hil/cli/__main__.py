"""``python -m hil.cli``: the ``san-hil`` command, from a checkout or any python with pytest-san installed."""

from __future__ import annotations

import sys

from hil.cli.main import main

sys.exit(main())
