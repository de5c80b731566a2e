"""``python -m secagg``: the ``secagg`` command."""

import sys

from secagg.cli import main

if __name__ == "__main__":
    sys.exit(main())
