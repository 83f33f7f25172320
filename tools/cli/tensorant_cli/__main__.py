"""`python -m tensorant_cli ...` is the same as `tensorant ...`."""

import sys

from tensorant_cli.main import main

sys.exit(main())
