"""The org's active-run reservations, which hold max_active_runs.

max_active_runs is one atomic decision: the org's reservations, keyed by run id, are one quotas-table
row written with its ETag, so two launches that both saw a free slot cannot both take it (the second
write is refused, re-reads and counts again). Keyed by run id, a repeated reservation or release is a
no-op; a reservation left behind by a crash is dropped when counting once its run has ended (or, still a
draft, after LAUNCH_GRACE_S: a claim stamped in the row, ended by shared/store/leases.py's rule). The row
holds at most max_active_runs (<= 1000) ids with a timestamp, about 30 characters each: under the
32K-character property limit.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from shared.clock import now_ts
from shared.errors import ConcurrencyError, Conflict, NotFound
from shared.lifecycle import HOLDS_MACHINE
from shared.models import RunState
from shared.store.keys import org_key
from shared.store.leases import ends, left
from shared.store.runs import Runs
from shared.store.tables import MAX_RACE_RETRIES, Table

# The quotas-table row of an org's reservations, and how long a reservation whose run is still a
# draft counts: a launch reserves before it writes the run queued, and that takes seconds (an HTTP
# request); one older is a launch that died in between.
ACTIVE_RUNS_KEY = "active-runs"
LAUNCH_GRACE_S = 600


@dataclass(frozen=True)
class ActiveSlot:
    granted: bool
    added: bool  # this call wrote the reservation (a failed launch frees only what it added)
    active: int  # the org's active runs as counted, this one included when added


class ActiveSlots:
    def __init__(self, quotas: Table, runs: Runs) -> None:
        self._table = quotas
        self._runs = runs

    def reserve(self, org: str, run_id: str, limit: int) -> ActiveSlot:
        """Reserve one of the org's `limit` active-run slots for run_id (or find it reserved).

        Active = a reservation still in force, or a run holding a machine (a run launched
        before reservations existed counts too). Granted when run_id holds a slot already or
        fewer than `limit` are active; the write is ETag-guarded, a lost race counts again.
        """
        for attempt in range(MAX_RACE_RETRIES):
            got = self._table.get(org_key(org), ACTIVE_RUNS_KEY)
            held: dict[str, int] = dict(got[0].get("runs", {})) if got else {}
            holding = {r.id for r in self._runs.active(org)}
            kept = {rid: at for rid, at in held.items() if rid in holding or self._launching(org, rid, at)}
            active = len(set(kept) | holding)
            if run_id in kept:
                return ActiveSlot(granted=True, added=False, active=active)
            if active >= limit:
                return ActiveSlot(granted=False, added=False, active=active)
            kept[run_id] = int(now_ts())  # the ended runs' reservations dropped above go with this write
            try:
                if got is None:
                    self._table.insert(org, ACTIVE_RUNS_KEY, {"runs": kept})
                else:
                    self._table.update(org, ACTIVE_RUNS_KEY, {"runs": kept}, got[1])
            except (ConcurrencyError, Conflict):
                time.sleep(random.uniform(0, 0.002 * (attempt + 1)))  # spread a crowd of launches out
                continue
            return ActiveSlot(granted=True, added=True, active=active + 1)
        raise ConcurrencyError("the organization's active runs kept changing; try again")

    def _launching(self, org: str, run_id: str, reserved_at: int) -> bool:
        """A reservation whose run held no machine when the runs were listed: still in force
        when its launch has written the run since, or may still be under way (the run is a
        draft and the reservation recent). Its run ended, or was deleted: dropped."""
        try:
            run, _ = self._runs.get(org, run_id)
        except NotFound:
            return False
        if run.state in HOLDS_MACHINE:
            return True
        return run.state == RunState.draft and left(ends(reserved_at, LAUNCH_GRACE_S)) > 0

    def release(self, org: str, run_id: str) -> None:
        """Free run_id's reservation; releasing one that is gone (released twice) changes nothing."""
        for _ in range(MAX_RACE_RETRIES):
            got = self._table.get(org_key(org), ACTIVE_RUNS_KEY)
            held = dict(got[0].get("runs", {})) if got else {}
            if got is None or run_id not in held:
                return
            del held[run_id]
            try:
                self._table.update(org, ACTIVE_RUNS_KEY, {"runs": held}, got[1])
                return
            except ConcurrencyError:
                continue
        # Still racing after the retries: left for the next reservation, which drops the
        # reservations of ended runs. Never raised: the caller's run write has succeeded.

    def held(self, org: str) -> dict[str, int]:
        """The org's reservations as stored (run id -> reserved at, epoch seconds), for tests and admins."""
        got = self._table.get(org_key(org), ACTIVE_RUNS_KEY)
        return dict(got[0].get("runs", {})) if got else {}
