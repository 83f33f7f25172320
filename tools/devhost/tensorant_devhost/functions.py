"""The app's functions as the host sees them: read from the FunctionApp itself, never a second list.

Each registered function becomes a FunctionInfo: its trigger kind (http, queue, timer), the
trigger's settings (`%NAME%` values resolved from app settings) and its bindings.
"""

from __future__ import annotations

import importlib
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from tensorant_devhost.logger import log
from tensorant_devhost.routes import RouteTemplate

ALL_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "TRACE"})


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


@dataclass
class FunctionInfo:
    """One registered function, as read from the FunctionApp (never from a second list)."""

    name: str
    kind: str  # http | queue | timer | other
    trigger: dict[str, Any]
    bindings: list[dict[str, Any]]
    func: Callable[..., Any]
    route: RouteTemplate | None = None
    methods: frozenset[str] = ALL_METHODS
    auth_level: str = "function"  # anonymous | function | admin: the host's default is function
    queue_name: str = ""
    connection: str = "AzureWebJobsStorage"
    schedule: str = ""
    run_on_startup: bool = False

    @property
    def arg_name(self) -> str:
        return str(self.trigger["name"])


def load_app(spec: str = "function_app:app") -> Any:
    """Import `module:attr` (attr defaults to `app`)."""
    module_name, _, attr = spec.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attr or "app")


# FunctionApp.get_functions() refuses to run twice on one app (it re-checks names against its
# own earlier result), so several hosts over one app (tests) share the first answer.
_indexed: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()


def describe_functions(app: Any) -> list[FunctionInfo]:
    if app not in _indexed:
        _indexed[app] = list(app.get_functions())
    out: list[FunctionInfo] = []
    for fn in _indexed[app]:
        trigger = {k: _plain(v) for k, v in fn.get_trigger().get_dict_repr().items()}
        bindings = [{k: _plain(v) for k, v in b.get_dict_repr().items()} for b in fn.get_bindings()]
        name = fn.get_function_name()
        info = FunctionInfo(name=name, kind="other", trigger=trigger, bindings=bindings, func=fn.get_user_function())
        ttype = trigger.get("type")
        if ttype == "httpTrigger":
            info.kind = "http"
            info.route = RouteTemplate(trigger.get("route") or name)
            if info.route.template.lower().split("/")[0].startswith("admin"):
                # The real host refuses these (its own admin API lives there); fail here too.
                raise ValueError(f"function {name}: route {info.route.template!r} starts with 'admin', "
                                 "which the Functions host reserves; choose another route")
            if trigger.get("methods"):
                info.methods = frozenset(str(m).upper() for m in trigger["methods"])
            info.auth_level = str(trigger.get("authLevel") or "function").lower()
        elif ttype == "queueTrigger":
            info.kind = "queue"
            info.queue_name = resolve_setting(str(trigger["queueName"]))
            info.connection = str(trigger.get("connection") or "AzureWebJobsStorage")
        elif ttype == "timerTrigger":
            info.kind = "timer"
            info.schedule = str(trigger["schedule"])
            info.run_on_startup = bool(trigger.get("runOnStartup", False))
        else:
            log.warning("function %s: trigger %s is not supported by the dev host; skipped", name, ttype)
        out.append(info)
    return out


def resolve_setting(value: str) -> str:
    """`%NAME%` means the app setting NAME, as in function.json."""
    if len(value) > 2 and value.startswith("%") and value.endswith("%"):
        return os.environ.get(value[1:-1], "")
    return value
