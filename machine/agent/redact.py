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


def _encodings(value: str) -> set[str]:
    """The forms a trainer most easily prints a secret in to get it past an exact match: reversed, base64
    (standard and URL-safe, padding dropped), hex (either case), percent-encoded (shared.log's list)."""
    import base64
    from urllib.parse import quote

    raw = value.encode()
    forms = {value[::-1], base64.b64encode(raw).decode().rstrip("="), base64.urlsafe_b64encode(raw).decode().rstrip("="),
             raw.hex(), raw.hex().upper(), quote(value, safe="")}
    return {form for form in forms if len(form) >= MIN_SECRET_CHARS}


def register_secret(value: str | None) -> None:
    if value and len(value) >= MIN_SECRET_CHARS:
        _SECRETS.add(value)
        _SECRETS.update(_encodings(value))


def redact_text(text: str) -> str:
    # Longest first: a secret that contains another is masked whole, not in pieces.
    for value in sorted(_SECRETS, key=len, reverse=True):
        if value in text:
            text = text.replace(value, MASK)
    return _BEARER.sub(r"\1" + MASK, text)
