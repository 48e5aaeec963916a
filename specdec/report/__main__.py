"""``python -m specdec.report <sweep_dir>``: rebuild a sweep's summary (e.g. after a crash)."""

import sys

from specdec.report.sweep import main

sys.exit(main())
