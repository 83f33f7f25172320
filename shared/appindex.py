"""The app's registered functions, read without re-indexing the app.

FunctionApp.get_functions() records names in the app's own state and raises on a second
call ("does not have a unique function name"). The Functions worker calls it once at
start-up, so anything else that reads the function list (OpenAPI, the local host, test
harnesses) builds it from the registered builders instead.
"""

from __future__ import annotations

from typing import Any


def functions_of(app: Any) -> list[Any]:
    return [builder.build(app.auth_level) for builder in app._function_builders]
