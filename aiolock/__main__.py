"""``python -m aiolock``: the command line (see ``aiolock.cli``)."""

import sys

from aiolock.cli import main

sys.exit(main())
