"""The functions a FunctionApp registers, read through azure-functions' public API.

Why not `app.get_functions()` directly: it records every name it returns in the app's public
`functions_bindings` and raises "does not have a unique function name" when called a second
time on the same app. The Functions worker calls it once at start-up, and the dev host and the
test harness call it on the same app object, so a plain second call would break one of them.

`functions_of` calls the public `get_functions()` on a shallow copy of the app instead: the copy
shares the registered function list (read only) and starts with an empty `functions_bindings`, so
it can be called any number of times, before or after the worker, and the app's own record stays
as the worker left it.
"""

from __future__ import annotations

import copy
from typing import Any


def functions_of(app: Any) -> list[Any]:
    """The app's functions (azure.functions Function objects), validated as the worker does."""
    scratch = copy.copy(app)
    scratch.functions_bindings = None  # the name record of this copy only; the app's own stays as it is
    return list(scratch.get_functions())

