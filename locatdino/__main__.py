"""``python -m locatdino``: same as the ``locatdino`` console script."""

import sys

from locatdino.cli import main

sys.exit(main())
