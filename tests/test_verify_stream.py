"""verify-adapter bounded in time (issue 38): a 3 GiB merged model read from storage at 10 MB/s (about 320 s,
four step budgets) is downloaded over several invocations, each within shared/budget.py's bound on the
simulated clock, and the run ends succeeded with its merged model verified.

The slow storage is a wrapper of the org's real (local) storage: every read advances the simulated clock by
its size at 10 MB/s. The merged object it serves for runs/<id>/merged.zip is a real merged archive (the one
tests/test_merged_api.py builds) preceded by zeros up to 3 GiB (zip readers find the archive from its end),
so the reads are cheap and the verifier judges a real archive; its sha256 is computed once here. The spool
does write the 3 GiB to this host's disk, in a temporary directory deleted with the test.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from adapter_format.base_models import MAX_MERGED_BYTES
from shared import budget
from shared.context import Context
from shared.org_storage.base import merged_key
from shared.queues import Queues
from shared.services.steps import verify_adapter as step
from shared.services.steps import verify_spool
from tests.fakes import Cloud, TwoOffers, draft, serve_memory
from tests.harness import Harness, trained_adapter_zip
from tests.support.clock import FakeClock
from tests.test_budget import Timings
from tests.test_merged_api import TINY, merged_zip


@pytest.fixture
def cloud() -> Iterator[Cloud]:
    """The memory provider for this module: the A10 and an H100."""
    yield from serve_memory(Cloud(), TwoOffers)


BANDWIDTH = 10_000_000  # bytes per simulated second
ZEROS = bytes(8 * 1024 * 1024)


class SlowReader:
    """`size` bytes: zeros up to `tail`, then `tail`; each read costs its size at BANDWIDTH on the clock."""

    def __init__(self, harness: Harness, tail: bytes, size: int, start: int) -> None:
        self.h, self.tail, self.size, self.at = harness, tail, size, start
        self.pad = size - len(tail)

    def read(self, n: int = -1) -> bytes:
        n = min(n if n > 0 else len(ZEROS), self.size - self.at, len(ZEROS))
        if self.at + n <= self.pad:
            chunk = ZEROS[:n]
        else:
            zeros = max(0, self.pad - self.at)
            chunk = ZEROS[:zeros] + self.tail[self.at + zeros - self.pad:self.at + n - self.pad]
        self.at += len(chunk)
        self.h.clock.advance(len(chunk) / BANDWIDTH)
        return chunk

    def close(self) -> None:
        pass

    def __enter__(self) -> SlowReader:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class SlowStorage:
    """The org's storage, read at BANDWIDTH; `big` maps a key to (tail, declared size)."""

    def __init__(self, inner: Any, harness: Harness, big: dict[str, tuple[bytes, int]]) -> None:
        self.inner, self.h, self.big = inner, harness, big
        self.reads: list[tuple[str, int]] = []  # (key, start) of every ranged read

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def open_range(self, key: str, start: int, max_bytes: int) -> tuple[Any, int]:
        self.reads.append((key, start))
        if key in self.big:
            tail, size = self.big[key]
        else:
            tail = self.inner.get(key, max_bytes)
            size = len(tail)
        if size > max_bytes:
            raise ValueError(f"{key} is {size} bytes, more than the {max_bytes} allowed")
        return SlowReader(self.h, tail, size, start), size

    def open_stream(self, key: str, max_bytes: int) -> Any:
        """The whole object (what a verification that does not carry on reads)."""
        return self.open_range(key, 0, max_bytes)[0]


def padded_sha256(tail: bytes, size: int) -> str:
    digest, left = hashlib.sha256(), size - len(tail)
    while left:
        n = min(left, len(ZEROS))
        digest.update(ZEROS[:n])
        left -= n
    digest.update(tail)
    return digest.hexdigest()


@pytest.fixture
def spool_root(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="tensorant-spool-test-"))
    monkeypatch.setattr(verify_spool, "root", lambda: folder)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def slow_storage(harness: Harness, monkeypatch: pytest.MonkeyPatch, big: dict[str, tuple[bytes, int]]) -> SlowStorage:
    from shared.runs.org_backends import storage_for

    slow = SlowStorage(storage_for(harness.ctx, harness.org), harness, big)
    monkeypatch.setattr(step, "storage_for", lambda ctx, org: slow)
    return slow


def complete(harness: Harness, run_id: str, merged_sha256: str, merged_size: int) -> None:
    agent = harness.agent(run_id)
    for phase in ("preparing", "training", "exporting"):
        agent.heartbeat(phase, 1.0)
    adapter = trained_adapter_zip(base_model=TINY)
    agent.upload(adapter)
    body = {"status": "ok", "sha256": hashlib.sha256(adapter).hexdigest(), "size": len(adapter),
            "merged_sha256": merged_sha256, "merged_size": merged_size}
    harness.ok("POST", f"/api/agent/runs/{run_id}/complete", token=agent.token, json_body=body)


def test_a_3_gib_merged_model_at_10_mb_s_is_verified_within_every_bound(
        harness: Harness, monkeypatch: pytest.MonkeyPatch, spool_root: Path) -> None:
    _, run = draft(harness, training={"merged": True})
    run_id = run["id"]
    harness.launch(run_id)
    tail, size = merged_zip(), MAX_MERGED_BYTES
    from shared.runs.org_backends import storage_for

    storage_for(harness.ctx, harness.org).put(merged_key(run_id), tail)  # what the agent uploaded: the slow storage pads it
    slow = slow_storage(harness, monkeypatch, {merged_key(run_id): (tail, size)})
    timings = Timings(harness)
    complete(harness, run_id, padded_sha256(tail, size), size)
    harness.drain()
    done = harness.ok("GET", f"/api/runs/{run_id}")
    assert done["state"] == "succeeded", (done["state"], done["reason"], harness.step_errors)
    assert (done["merged_size"], done["merged_note"]) == (size, ""), done["merged_note"]
    assert any(e["message"] == "merged model verified" for e in done["events"])
    spent = timings.spent["verify_adapter"]
    print("verify_adapter invocations (simulated s):", [round(s, 1) for s in spent])
    # 3 GiB at 10 MB/s is 322 s: four invocations or more, none past the step's bound.
    assert len(spent) >= 4 and max(spent) <= budget.invocation_bound_s(), spent
    assert sum(spent) >= size / BANDWIDTH
    told = [e["message"] for e in done["events"] if "downloaded over several invocations" in e["message"]]
    assert len(told) == 1 and "merged model's archive (3.22 GB)" in told[0], told
    # Each continuation read on from where the last stopped: every byte came from storage once.
    starts = [start for key, start in slow.reads if key == merged_key(run_id)]
    assert starts[0] == 0 and starts == sorted(set(starts)) and len(starts) == len(spent), starts
    assert not any(spool_root.iterdir())  # the spools went with the verification


def test_a_wrong_sha256_after_a_long_download_is_refused(
        harness: Harness, monkeypatch: pytest.MonkeyPatch, spool_root: Path) -> None:
    """The whole download spread over invocations is what is hashed: a digest that does not match what the
    agent reported refuses the merged model (the run still succeeds with its adapter)."""
    _, run = draft(harness, training={"merged": True})
    run_id = run["id"]
    harness.launch(run_id)
    tail, size = merged_zip(), 400_000_000  # 40 s at 10 MB/s: two invocations
    from shared.runs.org_backends import storage_for

    storage_for(harness.ctx, harness.org).put(merged_key(run_id), tail)
    slow_storage(harness, monkeypatch, {merged_key(run_id): (tail, size)})
    timings = Timings(harness)
    monkeypatch.setattr(verify_spool, "RESERVE_S", budget.step_budget_s() - 25)  # 25 s of reading per invocation
    complete(harness, run_id, "0" * 64, size)
    harness.drain()
    done = harness.ok("GET", f"/api/runs/{run_id}")
    assert done["state"] == "succeeded", (done["state"], done["reason"], harness.step_errors)
    assert len(timings.spent["verify_adapter"]) >= 2
    assert done["merged_sha256"] == "" and "sha256" in done["merged_note"], done["merged_note"]


def test_a_second_delivery_while_a_download_is_under_way_does_not_fork_it(
        harness: Harness, monkeypatch: pytest.MonkeyPatch, spool_root: Path) -> None:
    """A message delivered twice: the copy that finds the progress changed since it read it stops, and the
    one chain of messages carries on to a verified run."""
    from shared.models import StepMessage
    from shared.store import get_store

    _, run = draft(harness, training={"merged": True})
    run_id = run["id"]
    harness.launch(run_id)
    tail, size = merged_zip(), 300_000_000
    from shared.runs.org_backends import storage_for

    storage_for(harness.ctx, harness.org).put(merged_key(run_id), tail)
    slow_storage(harness, monkeypatch, {merged_key(run_id): (tail, size)})
    monkeypatch.setattr(verify_spool, "RESERVE_S", budget.step_budget_s() - 10)
    complete(harness, run_id, padded_sha256(tail, size), size)
    stored, _ = get_store().runs.get(harness.org, run_id)
    with budget.within(budget.step_budget_s()):
        step.verify_adapter(harness.ctx, StepMessage(org=harness.org, run_id=run_id))  # the completion's message, early
    first, _ = get_store().runs.get(harness.org, run_id)
    assert first.verify_progress is not None and 0 < first.verify_progress.offset < size
    # A stale copy that read the run before that progress was recorded is refused by carry_on.
    sent: list[Any] = []
    queues = type("Q", (), {"send": lambda self, *a, **k: sent.append(a)})()
    ctx = harness.ctx
    step.carry_on(Context(ctx.settings, ctx.store, cast(Queues, queues)), stored,
                  first.verify_progress.model_copy(update={"offset": 1}))
    assert sent == [] and get_store().runs.get(harness.org, run_id)[0].verify_progress == first.verify_progress
    monkeypatch.undo()
    monkeypatch.setattr(verify_spool, "root", lambda: spool_root)
    slow_storage(harness, monkeypatch, {merged_key(run_id): (tail, size)})
    harness.drain()
    done = harness.ok("GET", f"/api/runs/{run_id}")
    assert done["state"] == "succeeded" and done["merged_note"] == "", (done["reason"], done["merged_note"])
    assert get_store().runs.get(harness.org, run_id)[0].verify_progress is None  # cleared with the run's move


def test_a_spool_carries_on_in_a_new_process_and_one_instance_downloads_at_a_time(spool_root: Path) -> None:
    """A restarted worker has no sha256 state in memory: it hashes the spool again from local disk and appends
    the rest; a second invocation on the instance while one holds the run's spools does not touch them."""
    from shared import clock

    fake = FakeClock()
    clock.set_clock(fake)
    try:
        data = bytes(range(256)) * 12_000  # about 3 MB: three chunks and some
        h = type("H", (), {"clock": fake})()
        slow = SlowStorage(None, h, {"k": (data, len(data))})  # type: ignore[arg-type]
        path = spool_root / "merged.part"
        with budget.within(verify_spool.RESERVE_S + 0.15):  # room for two 1 MiB reads at 10 MB/s
            got = verify_spool.fetch(slow, "k", path, len(data), "the archive")
        assert isinstance(got, verify_spool.Partial) and got.offset == 2 * verify_spool.CHUNK
        verify_spool._hashes.clear()  # a new process
        done = verify_spool.fetch(slow, "k", path, len(data), "the archive")
        assert isinstance(done, verify_spool.Spooled)
        assert done.sha256 == hashlib.sha256(data).hexdigest() and path.read_bytes() == data
        assert [start for _, start in slow.reads] == [0, 2 * verify_spool.CHUNK]
        with verify_spool.locked("run-1") as first, verify_spool.locked("run-1") as second:
            assert first and not second
        with verify_spool.locked("run-1") as again:
            assert again
    finally:
        clock.set_clock(None)


def test_a_spool_of_an_earlier_verification_is_never_appended_to(
        harness: Harness, monkeypatch: pytest.MonkeyPatch, spool_root: Path) -> None:
    """A run given up on while verifying keeps its verify_progress; the next verification (of that stay or of a
    recovery) must not carry on the earlier one's spool, whose bytes may be of another archive."""
    from datetime import timedelta

    from shared.models import VerifyProgress
    from shared.store import get_store

    _, run = draft(harness, training={"merged": True})
    run_id = run["id"]
    harness.launch(run_id)
    tail, size = merged_zip(), 50_000_000
    from shared.runs.org_backends import storage_for

    storage_for(harness.ctx, harness.org).put(merged_key(run_id), tail)
    slow_storage(harness, monkeypatch, {merged_key(run_id): (tail, size)})
    complete(harness, run_id, padded_sha256(tail, size), size)
    stale = spool_root / run_id / "abc123"
    stale.mkdir(parents=True)
    (stale / "merged.part").write_bytes(b"\xff" * 1000)  # another archive's first bytes

    def left_over(r: Any) -> Any:
        return r.model_copy(update={"verify_progress": VerifyProgress(
            artifact="merged", offset=1000, size=size, token="abc123", since=r.state_changed_at - timedelta(hours=1))})

    get_store().runs.mutate(harness.org, run_id, left_over)
    harness.drain()
    done = harness.ok("GET", f"/api/runs/{run_id}")
    assert done["state"] == "succeeded" and done["merged_note"] == "", (done["reason"], done["merged_note"])
