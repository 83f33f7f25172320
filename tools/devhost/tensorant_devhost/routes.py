"""Functions (ASP.NET-style) route templates: runs/{id}, {id:int}, {name?}, {*rest}.

Routes are tried in ASP.NET precedence order: literal segments before constrained
parameters, before plain parameters, before optional ones and catch-alls.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import unquote

_PARAM = re.compile(r"\{([^{}]+)\}")
_CONSTRAINT_RE = {
    "int": r"-?\d+",
    "long": r"-?\d+",
    "bool": r"(?i:true|false)",
    "alpha": r"[A-Za-z]+",
    "guid": r"\{?[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}\}?",
    "float": r"-?\d+(?:\.\d+)?",
    "double": r"-?\d+(?:\.\d+)?",
    "decimal": r"-?\d+(?:\.\d+)?",
}
_CHECK = re.compile(r"^(min|max|minlength|maxlength|length|range)\((-?\d+)(?:,\s*(-?\d+))?\)$")


@dataclass
class _Param:
    name: str
    group: str
    checks: list[tuple[str, int, int | None]] = field(default_factory=list)


def _value_ok(value: str, checks: list[tuple[str, int, int | None]]) -> bool:
    for kind, a, b in checks:
        if kind in ("min", "max", "range"):
            try:
                n = int(value)
            except ValueError:
                return False
            if (kind == "min" and n < a) or (kind == "max" and n > a) or (kind == "range" and not a <= n <= (b or a)):
                return False
        elif (
            (kind == "minlength" and len(value) < a)
            or (kind == "maxlength" and len(value) > a)
            or (kind == "length" and not (len(value) == a if b is None else a <= len(value) <= b))
        ):
            return False
    return True


class RouteTemplate:
    def __init__(self, template: str) -> None:
        self.template = template.strip("/")
        self.params: list[_Param] = []
        self.precedence: tuple[int, ...] = ()
        parts: list[str] = []
        scores: list[int] = []
        for seg in self.template.split("/") if self.template else []:
            regex, score = self._segment(seg)
            parts.append(regex)
            scores.append(score)
        # The first segment has no leading slash; optional segments carry their own.
        pattern = ""
        for i, (regex, score) in enumerate(zip(parts, scores, strict=True)):
            sep = "" if i == 0 else "/"
            pattern += f"(?:{sep}{regex})?" if score >= 4 else f"{sep}{regex}"
        self.regex = re.compile("^" + pattern + "$", re.IGNORECASE)
        self.precedence = tuple(scores)

    def _segment(self, seg: str) -> tuple[str, int]:
        out = ""
        pos = 0
        score = 1
        for m in _PARAM.finditer(seg):
            out += re.escape(seg[pos:m.start()])
            pos = m.end()
            spec = m.group(1)
            catch_all = spec.startswith("*")
            spec = spec.lstrip("*")
            name, *constraints = spec.split(":")
            optional = name.endswith("?") or "=" in name
            name = name.rstrip("?").split("=")[0]
            group = f"p{len(self.params)}"
            param = _Param(name, group)
            value_re = ".*" if catch_all else "[^/]+"
            for c in constraints:
                c = c.rstrip("?")
                if c in _CONSTRAINT_RE:
                    value_re = _CONSTRAINT_RE[c]
                elif m2 := _CHECK.match(c):
                    param.checks.append((m2.group(1), int(m2.group(2)), int(m2.group(3)) if m2.group(3) else None))
            self.params.append(param)
            out += f"(?P<{group}>{value_re})"
            score = max(score, 5 if catch_all else 4 if optional else 2 if constraints else 3)
        out += re.escape(seg[pos:])
        return out, score

    def match(self, path: str) -> dict[str, str] | None:
        m = self.regex.match(path.strip("/"))
        if not m:
            return None
        values: dict[str, str] = {}
        for p in self.params:
            raw = m.group(p.group)
            if raw is None:
                continue
            value = unquote(raw)
            if not _value_ok(value, p.checks):
                return None
            values[p.name] = value
        return values
