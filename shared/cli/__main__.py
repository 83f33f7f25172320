"""`python -m shared.cli ...` is the same as `tensorant ...`."""

import sys

from shared.cli.main import main

sys.exit(main())
