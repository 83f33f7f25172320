"""Reads infra/aws's policy template: which actions it grants (ignoring resources/conditions)."""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Iterable
from pathlib import Path

INFRA = Path(__file__).resolve().parents[3] / "infra" / "aws"
# Actions AWS allows without any permission.
ALWAYS_ALLOWED = {"sts:GetCallerIdentity"}


def granted_actions() -> list[str]:
    policy = json.loads((INFRA / "control-plane-policy.json").read_text())
    statements = list(policy["Statement"])
    statements.append(json.loads((INFRA / "passrole-statement.json").read_text()))
    statements.append(json.loads((INFRA / "quota-preflight-statement.json").read_text()))  # optional grant
    out: list[str] = []
    for st in statements:
        if st.get("Effect") != "Allow":
            continue
        actions = st["Action"]
        out.extend([actions] if isinstance(actions, str) else actions)
    return out


def not_granted(actions: Iterable[str]) -> list[str]:
    granted = [g.lower() for g in granted_actions()]
    return sorted(a for a in actions if a not in ALWAYS_ALLOWED
                  and not any(fnmatch.fnmatchcase(a.lower(), g) for g in granted))
