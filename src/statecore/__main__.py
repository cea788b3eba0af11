"""``python -m statecore ...`` = the ``statecore`` command."""

import sys

from statecore.cli import main

if __name__ == "__main__":
    sys.exit(main())
