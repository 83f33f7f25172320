"""The app's registered functions, indexed once.

FunctionApp.get_functions() validates names into the app's own state and raises on a
second call ("does not have a unique function name"), so everything that reads the
function list (OpenAPI, the local host, test harnesses) goes through here.
"""

from __future__ import annotations

from typing import Any

_cache: dict[int, list[Any]] = {}


def functions_of(app: Any) -> list[Any]:
    key = id(app)
    if key not in _cache:
        _cache[key] = list(app.get_functions())
    return _cache[key]
