"""``python -m benchmarks.gpu_check``: the check of ``check.py``."""

import sys

from benchmarks.gpu_check.check import main

sys.exit(main())
