"""Secret masking for the agent's own output and the trainer lines it forwards.

The agent's copy of the control plane's value redaction (shared.log), kept here because
the agent imports nothing outside its package: it runs in the training image, which
does not hold the function app. Every value registered is replaced by MASK wherever it
appears, and bearer tokens are masked by shape.
"""

from __future__ import annotations

import re

MASK = "***"
_SECRETS: set[str] = set()
_BEARER = re.compile(r"(Bearer\s+)[A-Za-z0-9._\-]+")
# Shorter values would mask ordinary words in the logs; no real token is this short.
MIN_SECRET_CHARS = 6


def register_secret(value: str | None) -> None:
    if value and len(value) >= MIN_SECRET_CHARS:
        _SECRETS.add(value)


def redact_text(text: str) -> str:
    # Longest first: a secret that contains another is masked whole, not in pieces.
    for value in sorted(_SECRETS, key=len, reverse=True):
        if value in text:
            text = text.replace(value, MASK)
    return _BEARER.sub(r"\1" + MASK, text)
