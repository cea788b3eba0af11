"""``python -m bench [--quick] [--case NAME ...] [--json FILE] [--plot FILE] [--list]``: see
:mod:`bench.cli`."""

import sys

from bench.cli import main

sys.exit(main())
