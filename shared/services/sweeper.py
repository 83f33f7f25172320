"""The sweeper: finds machines, disks and NICs that bill without a live run, and releases them.

Order matters: list the cloud first, then read the runs, so a machine created during
the sweep (its run already written) is never mistaken for a leak. Nothing younger
than the grace period, and nothing whose run changed state within it, is touched.
Only resources carrying this deployment's marks are ever considered.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta
from typing import Any

from shared.clock import now
from shared.log import get_logger
from shared.models import CloudResource, ConnectionStatus, Outcome, RunRecord, RunState, StepMessage
from shared.providers.base import RunRef
from shared.providers.errors import ProviderError
from shared.queues import Queue, get_queues
from shared.runs.lifecycle import TERMINAL
from shared.services.common import compute_for
from shared.settings import get_settings
from shared.store import get_store


def sweep(*, dry_run: bool) -> dict[str, Any]:
    settings, store = get_settings(), get_store()
    grace = timedelta(seconds=settings.sweep_grace_s)
    findings: list[dict[str, Any]] = []
    listed = 0
    for conn in store.list_connections():
        if not conn.slot.startswith("compute:") or conn.status == ConnectionStatus.checking:
            continue
        try:
            provider = compute_for(conn.org, conn.provider)
            cloud = [r for r in provider.list_managed()
                     if r.deployment == settings.deployment_id and r.org in ("", conn.org)]
        except ProviderError as exc:
            findings.append({"org": conn.org, "provider": conn.provider, "action": "none",
                             "reason": f"listing failed: {exc.reason}"})
            continue
        listed += len(cloud)
        runs = {r.id: r for r in store.list_runs(conn.org)}  # read after listing the cloud
        by_run: dict[str, list[CloudResource]] = defaultdict(list)
        for res in cloud:
            by_run[res.run_id].append(res)
        t = now()
        for run_id, resources in by_run.items():
            run = runs.get(run_id)
            if any(r.created_at and t - r.created_at < grace for r in resources):
                continue
            if run is not None and t - run.state_changed_at < grace:
                continue
            if run is not None and run.state not in TERMINAL:
                continue  # a live run owns it; its own steps release it
            reason = "its run is missing" if run is None else f"its run is {run.state.value}"
            finding = {"org": conn.org, "provider": conn.provider, "run_id": run_id, "reason": reason,
                       "resources": [f"{r.kind}:{r.id}" for r in resources],
                       "action": "would release" if dry_run else "release"}
            if not dry_run:
                try:
                    out = provider.release(RunRef(settings.deployment_id, conn.org, run_id), resources)
                    finding["done"] = out.done
                    finding["detail"] = out.detail
                except ProviderError as exc:
                    finding["done"] = False
                    finding["detail"] = exc.reason
            store.audit("sweep" if not dry_run else "sweep-dry-run", **finding)
            findings.append(finding)
        findings.extend(_resend_stuck_releases(conn.org, runs.values(), dry_run))
    get_logger().info("sweep finished", extra={"dry_run": dry_run, "listed": listed, "findings": len(findings)})
    return {"dry_run": dry_run, "listed": listed, "findings": findings}


def _resend_stuck_releases(org: str, runs: Any, dry_run: bool) -> list[dict[str, Any]]:
    out = []
    t = now()
    for run in runs:
        run = run  # type: RunRecord
        if run.state != RunState.releasing or (run.release_after and run.release_after > t):
            continue
        if t - run.state_changed_at < timedelta(seconds=60) and not run.release_after:
            continue
        finding = {"org": org, "run_id": run.id, "action": "would re-send release" if dry_run else "re-send release",
                   "reason": run.release_error or "release not confirmed yet", "outcome": (run.outcome or Outcome.failed).value}
        if not dry_run:
            get_queues().send(Queue.release, StepMessage(org=org, run_id=run.id, reason="sweeper"))
        get_store().audit("sweep-release" if not dry_run else "sweep-dry-run", **finding)
        out.append(finding)
    return out
