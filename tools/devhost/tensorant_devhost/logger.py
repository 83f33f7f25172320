"""The dev host's logger ("tensorant.devhost"): its own stderr handler, timestamped lines.

`make run` (run.py) sets its level: DEBUG shows every HTTP request too.
"""

from __future__ import annotations

import logging
import sys

log = logging.getLogger("tensorant.devhost")
if not log.handlers:
    _handler = logging.StreamHandler(sys.stderr)
    _handler.setFormatter(logging.Formatter("[%(asctime)s] %(message)s"))
    log.addHandler(_handler)
    log.setLevel(logging.INFO)
    # The app's Powertools logger is named "tensorant": do not print every line twice through it.
    log.propagate = False
