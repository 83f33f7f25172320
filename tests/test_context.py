"""The invocation context (shared/context.py): services take the store, the queues and the settings from the
`ctx` the edges build and hand down, never from a process global.

The ast check counts every call of get_store(), get_queues(), get_settings() and invocation() in production
code; each is allowed only where the table below says why. A new one fails, and so does a stale entry.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCTION = ["shared", "functions", "machine", "adapter_format", "function_app.py"]

# The composition root and the getters' own modules.
ROOT_MODULES = {"shared/context.py", "shared/store/repo.py", "shared/queues.py", "shared/settings.py"}
# Libraries below the services that read the process's configuration (never the store or the queues):
# each setting they read is fixed for the process's life, and they are called from places without a context
# (the CLI's token minting, the providers' bootstrap environment, an S3 client's endpoint policy).
SETTINGS_READERS = {
    "function_app.py": "checks the production settings at import, so a bad setting fails the host's start",
    "shared/security.py": "token minting and the sealing key (minted by tools and tests too)",
    "shared/openapi.py": "the storage connection models the deployment offers",
    "shared/webhooks/send.py": "the test-only allowance for loopback receivers",
    "shared/org_storage/config.py": "the test-only allowance for private S3 endpoints",
    "shared/org_storage/s3.py": "the test-only allowance for private S3 endpoints",
    "shared/providers/registry.py": "which providers the deployment enables",
    "shared/providers/bootstrap_env.py": "the public URL and deployment id written into a machine's bootstrap",
}
# The edges: the only places that build a context from the process.
EDGES = {"shared/http.py", "shared/services/steps/runner.py"}
EDGE_FOLDERS = ("functions/",)  # the timer triggers


def _files() -> list[Path]:
    out: list[Path] = []
    for name in PRODUCTION:
        p = ROOT / name
        out.extend([p] if p.is_file() else sorted(p.rglob("*.py")))
    return out


def calls_of(source: str, names: set[str]) -> list[tuple[str, int]]:
    """The calls of `names` (bare or as an attribute, e.g. context.invocation()), with their lines."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if name in names:
                found.append((name, node.lineno))
    return sorted(found, key=lambda c: c[1])


def hidden_reads() -> list[str]:
    """Every call that reads the process where the rules above do not allow it, as `path:line name`."""
    bad = []
    for path in _files():
        rel = path.relative_to(ROOT).as_posix()
        if rel in ROOT_MODULES:
            continue
        for name, line in calls_of(path.read_text(), {"get_store", "get_queues", "get_settings", "invocation"}):
            allowed = (name == "get_settings" and rel in SETTINGS_READERS) or (
                name == "invocation" and (rel in EDGES or rel.startswith(EDGE_FOLDERS)))
            if not allowed:
                bad.append(f"{rel}:{line} {name}()")
    return bad


def test_services_take_the_store_queues_and_settings_from_their_context() -> None:
    bad = hidden_reads()
    assert not bad, ("these read the process's store, queues or settings instead of the `ctx` they are given "
                     "(take `ctx: Context` as the first parameter and use ctx.store / ctx.queues / ctx.settings; "
                     "see shared/context.py):\n" + "\n".join(bad))


def test_every_allowed_settings_reader_still_reads_them() -> None:
    stale = [rel for rel in SETTINGS_READERS if not calls_of((ROOT / rel).read_text(), {"get_settings"})]
    assert not stale, f"no longer read settings: delete their entries from SETTINGS_READERS: {stale}"


def test_the_check_finds_each_kind_of_hidden_read() -> None:
    bad = ("from shared.store import get_store\nfrom shared import context, queues\n"
           "def f():\n    get_store().runs\n    queues.get_queues().send\n    return context.invocation()\n")
    assert [n for n, _ in calls_of(bad, {"get_store", "get_queues", "invocation"})] == [
        "get_store", "get_queues", "invocation"]


def test_a_service_writes_to_the_store_of_the_context_it_is_given(env: dict[str, str]) -> None:
    """Two contexts over two table prefixes: what a service writes through one is not in the other, nor in the
    process's own store, so nothing reached for a global."""
    from shared.context import Context, invocation
    from shared.runs import org_limits
    from shared.store import Store
    from tests.support.storage import drop_tables

    process = invocation()
    other = Context(settings=process.settings, queues=process.queues,
                    store=Store(env["AzureWebJobsStorage"], env["TENSORANT_TABLE_PREFIX"] + "x"))
    try:
        org_limits.set_limits(other, "org-ctx", org_limits.OrgLimits(max_active_runs=3))
        assert org_limits.get_limits(other, "org-ctx").max_active_runs == 3
        assert org_limits.get_limits(process, "org-ctx").max_active_runs == org_limits.OrgLimits().max_active_runs
    finally:
        drop_tables(other.store)


def test_the_http_edge_and_the_step_runner_hand_their_context_down(env: dict[str, str]) -> None:
    from shared import http
    from shared.context import Context, invocation
    from shared.services.steps.runner import run_step
    from shared.steps import Step

    got: list[Context] = []

    def seen(ctx: Context) -> dict[str, str]:
        got.append(ctx)
        return {"prefix": ctx.store.prefix}

    reply = http.respond(seen)
    assert json.loads(reply.get_body()) == {"prefix": env["TENSORANT_TABLE_PREFIX"]}
    run_step(Step.retain, json.dumps({"org": "org-a", "run_id": "r-ctx"}), lambda ctx, msg: got.append(ctx))
    assert [c.store for c in got] == [invocation().store] * 2


@pytest.mark.parametrize("rel", sorted(EDGES))
def test_each_edge_builds_a_context(rel: str) -> None:
    assert calls_of((ROOT / rel).read_text(), {"invocation"}), f"{rel} no longer builds the invocation context"
