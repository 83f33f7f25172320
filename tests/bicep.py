"""A reader for the subset of Bicep that infra/controlplane/main.bicep uses (there is no Bicep compiler
here): params with their decorators, vars, and resources with their condition, type, api-version and
body. Objects and arrays become dicts and lists; a string literal without interpolation becomes str;
anything else (an expression, an interpolated string) stays an `Expr` holding its source text."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Expr:
    text: str


@dataclass
class Resource:
    symbol: str
    type: str
    api_version: str
    condition: str | None  # the `if (...)` text, or None when always deployed
    loop: str | None  # the `for x in y:` text of a resource loop
    body: dict[str, Any]


@dataclass
class Template:
    params: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> {type, default, decorators}
    variables: dict[str, Any] = field(default_factory=dict)
    resources: dict[str, Resource] = field(default_factory=dict)

    def of_type(self, type_: str) -> list[Resource]:
        return [r for r in self.resources.values() if r.type.lower() == type_.lower()]


def _strip_comments(text: str) -> str:
    out, i, in_str = [], 0, False
    while i < len(text):
        c = text[i]
        if in_str:
            out.append(c)
            if c == "\\":
                out.append(text[i + 1])
                i += 1
            elif c == "'":
                in_str = False
        elif c == "'":
            in_str = True
            out.append(c)
        elif text.startswith("//", i):
            while i < len(text) and text[i] != "\n":
                i += 1
            continue
        else:
            out.append(c)
        i += 1
    return "".join(out)


class _Parser:
    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0

    def ws(self, newlines: bool = True) -> None:
        while self.i < len(self.s) and self.s[self.i] in (" \t\r\n," if newlines else " \t\r"):
            self.i += 1

    def value(self) -> Any:
        self.ws()
        c = self.s[self.i]
        if c == "{":
            return self.obj()
        if c == "[" and not self.s.startswith("[for ", self.i):
            return self.arr()
        return self.expr()

    def obj(self) -> dict[str, Any]:
        self.i += 1
        out: dict[str, Any] = {}
        while True:
            self.ws()
            if self.s[self.i] == "}":
                self.i += 1
                return out
            m = re.compile(r"'([^']*)'|(\w+)").match(self.s, self.i)
            assert m, f"key expected at {self.s[self.i:self.i + 40]!r}"
            key = m.group(1) if m.group(1) is not None else m.group(2)
            self.i = m.end()
            self.ws(newlines=False)
            assert self.s[self.i] == ":", f"':' expected after {key!r}"
            self.i += 1
            out[key] = self.value()

    def arr(self) -> list[Any]:
        self.i += 1
        out: list[Any] = []
        while True:
            self.ws()
            if self.s[self.i] == "]":
                self.i += 1
                return out
            out.append(self.value())

    def expr(self) -> Any:
        """Up to a newline, comma or closing bracket at depth 0."""
        start, depth = self.i, 0
        while self.i < len(self.s):
            c = self.s[self.i]
            if c == "'":
                self.string_end()
                continue
            if c in "([{":
                depth += 1
            elif c in ")]}":
                if depth == 0:
                    break
                depth -= 1
            elif c in "\n," and depth == 0:
                break
            self.i += 1
        text = self.s[start:self.i].strip()
        m = re.fullmatch(r"'((?:[^'\\$]|\\.|\$(?!\{))*)'", text)
        if m:
            return m.group(1).replace("\\'", "'")
        if re.fullmatch(r"-?\d+", text):
            return int(text)
        if text in ("true", "false"):
            return text == "true"
        return Expr(text)

    def string_end(self) -> None:
        self.i += 1
        depth = 0
        while True:
            c = self.s[self.i]
            if c == "\\":
                self.i += 2
                continue
            if self.s.startswith("${", self.i):
                depth += 1
                self.i += 2
                continue
            if c == "}" and depth:
                depth -= 1
            elif c == "'" and not depth:
                self.i += 1
                return
            elif c == "'" and depth:  # a string inside an interpolation
                self.string_end()
                continue
            self.i += 1


def parse(text: str) -> Template:
    p = _Parser(_strip_comments(text))
    t = Template()
    decorators: list[str] = []
    while True:
        p.ws()
        if p.i >= len(p.s):
            return t
        rest = p.s[p.i:]
        if rest.startswith("@"):
            m = re.match(r"@\w+(\((?:[^()']|'(?:[^'\\]|\\.)*'|\([^()]*\))*\))?", rest)
            assert m, rest[:60]
            decorators.append(m.group(0))
            p.i += m.end()
            continue
        m = re.match(r"param (\w+) (\w+)(\s*=\s*)?", rest)
        if m:
            p.i += m.end()
            default = p.value() if m.group(3) else None
            t.params[m.group(1)] = {"type": m.group(2), "default": default, "decorators": decorators}
            decorators = []
            continue
        m = re.match(r"var (\w+)\s*=\s*", rest)
        if m:
            p.i += m.end()
            t.variables[m.group(1)] = p.value()
            continue
        m = re.match(r"resource (\w+) '([^'@]+)@([^']+)'( existing)?\s*=\s*", rest)
        if m:
            p.i += m.end()
            condition = loop = None
            if p.s.startswith("if (", p.i):
                start, depth = p.i + 4, 1
                p.i = start
                while depth:
                    depth += {"(": 1, ")": -1}.get(p.s[p.i], 0)
                    p.i += 1
                condition = p.s[start:p.i - 1]
                p.ws()
            loop_match = re.compile(r"\[for (.+?):\s*").match(p.s, p.i)
            if loop_match:
                loop = loop_match.group(1)
                p.i = loop_match.end()
            body = p.value()
            if loop:
                p.ws()
                assert p.s[p.i] == "]", "a resource loop ends with ]"
                p.i += 1
            t.resources[m.group(1)] = Resource(m.group(1), m.group(2), m.group(3), condition, loop, body)
            continue
        m = re.match(r"output (\w+) (\w+)\s*=\s*", rest)
        if m:
            p.i += m.end()
            p.value()
            continue
        raise AssertionError(f"unexpected Bicep at {rest[:80]!r}")
