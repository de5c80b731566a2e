"""``python -m secagg.cli``: the ``secagg`` command (as ``python -m secagg``)."""

import sys

from secagg.cli import main

if __name__ == "__main__":
    sys.exit(main())
