"""The cloud's own backstop: the VM's auto-shutdown schedule deallocates it at the run's hard deadline plus a
margin, even if the control plane is gone for good.

Why: a guest poweroff (the agent stops the machine by itself past its deadline, machine/agent/guard.py)
leaves an Azure VM "Stopped", still allocated and billed for compute; only a deallocate ends the GPU's
bill, and with the control plane gone nothing would send one. Azure's VM auto-shutdown does: it is a
Microsoft.DevTestLab/schedules resource named `shutdown-computevm-<vmName>` in the VM's resource group
(GlobalSchedules_CreateOrUpdate, api-version 2018-09-15, azure-rest-api-specs
specification/devtestlabs/.../stable/2018-09-15/DTL.json), taskType `ComputeVmShutdownTask`, whose action is
a deallocate (Microsoft's auto-shutdown documentation; the portal's "Auto-shutdown" blade writes the same
resource, and ARM refuses another name for that task with 400).

It is DAILY, not one-off: `dailyRecurrence.time` ("HHmm") in `timeZoneId`. So:
- the time is the hard deadline plus MARGIN_S, in UTC ("UTC" is a Windows time zone id), rounded up to the
  minute; it fires first at that moment only when that moment is less than a day away. A run whose deadline is
  further out (runtime limits go up to 7 days) gets no schedule at launch: a daily schedule would deallocate
  it on an earlier day, mid-training. Such a run has the agent's own poweroff and the control plane, not this;
- on the next days it fires again at the same time: on a deallocated VM that changes nothing; a VM the control
  plane starts again (recover, resume) has its schedule moved to its new deadline (arm_backstop), and the
  release deletes it with the VM (before the VM, so no schedule outlives its VM's release).
It needs Microsoft.DevTestLab/schedules/read, write and delete at the training resource group, beyond the
product document's training role (infra/azure/tensorant-autoshutdown-role.json), and the Microsoft.DevTestLab
resource provider registered in the subscription. Without them the launch goes on without a backstop (a
warning in the log; the connection check warns beforehand, saying what that costs).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

from shared.clock import now
from shared.errors import AuthError, ProviderError
from shared.log import get_logger
from shared.models import Check, CheckStatus
from shared.providers.azure import sdk
from shared.providers.azure.client import AzureClient

API_VERSION = "2018-09-15"
TASK_TYPE = "ComputeVmShutdownTask"
TIME_ZONE = "UTC"
# After the hard deadline: the agent's own stop (its deadline + 30 min) and the control plane's retain come first.
MARGIN_S = 1800
# A daily schedule fires first at its time of day: armed only when that first firing is the deadline's.
DAY_S = 24 * 3600
ACTIONS = ("Microsoft.DevTestLab/schedules/read", "Microsoft.DevTestLab/schedules/write",
           "Microsoft.DevTestLab/schedules/delete")
WITHOUT = ("without it a VM that stopped itself (its agent powers it off past the run's deadline) stays allocated "
           "and keeps billing its GPU until the control plane returns and deallocates it")


def schedule_name(vm_name: str) -> str:
    return f"shutdown-computevm-{vm_name}"


def fire_at(until: datetime, at: datetime | None = None) -> datetime | None:
    """When the schedule should fire: until + MARGIN_S, rounded up to the minute; None when that is a day or
    more away (a daily schedule would fire earlier, on the same time of an earlier day)."""
    at = at or now()
    fire = until.astimezone(UTC) + timedelta(seconds=MARGIN_S)
    fire = datetime.fromtimestamp(math.ceil(fire.timestamp() / 60) * 60, UTC)
    return fire if timedelta(0) < fire - at < timedelta(seconds=DAY_S) else None


def body(vm_id: str, region: str, tags: dict[str, str], fire: datetime) -> dict[str, Any]:
    return {"location": region, "tags": tags, "properties": {
        "status": "Enabled", "taskType": TASK_TYPE, "dailyRecurrence": {"time": fire.strftime("%H%M")},
        "timeZoneId": TIME_ZONE, "notificationSettings": {"status": "Disabled"}, "targetResourceId": vm_id}}


class Backstop:
    """One connection's auto-shutdown schedules, through the compute client's ARM pipeline (its credential,
    retries and endpoint; azure-mgmt-devtestlabs is not needed for three plain requests)."""

    def __init__(self, client: AzureClient, subscription: str, rg: str, region: str) -> None:
        self.client = client
        self.rg = rg
        self.region = region
        self.base = f"/subscriptions/{subscription}/resourceGroups/{rg}/providers/Microsoft.DevTestLab/schedules"

    def _request(self, method: str, path: str, json_body: Any = None) -> Any:
        HttpRequest = sdk.core_rest.HttpRequest

        def send() -> Any:
            request = HttpRequest(method, path, params={"api-version": API_VERSION},
                                  **({"json": json_body} if json_body is not None else {}))
            resp = self.client.compute().send_request(request)
            if resp.status_code == 404 and method in ("GET", "DELETE"):
                return None
            resp.raise_for_status()
            return resp.json() if resp.content else {}

        return self.client.call(f"{method} auto-shutdown schedule {path.rsplit('/', 1)[-1]}", send)

    def arm(self, vm_name: str, vm_id: str, tags: dict[str, str], until: datetime | None) -> str:
        """Write (or move) the VM's schedule to fire at until + MARGIN_S; never raises. Returns what was done,
        in words (also logged)."""
        log = get_logger()
        fire = fire_at(until) if until is not None else None
        if fire is None:
            note = ("no auto-shutdown backstop: the run's hard deadline is more than a day away, and Azure's "
                    "schedule is daily (it would deallocate the VM on an earlier day)") if until else (
                    "no auto-shutdown backstop: no hard deadline was given")
            log.info(note, extra={"vm": vm_name})
            return note
        try:
            self._request("PUT", f"{self.base}/{schedule_name(vm_name)}", body(vm_id, self.region, tags, fire))
        except ProviderError as exc:
            note = f"no auto-shutdown backstop ({exc.reason[:300]}); {WITHOUT}"
            log.warning("azure: auto-shutdown schedule not written", extra={"vm": vm_name, "reason": exc.reason[:300],
                                                                           "auth": isinstance(exc, AuthError)})
            return note
        note = f"auto-shutdown (deallocate) at {fire.strftime('%Y-%m-%d %H:%M')} UTC, daily"
        log.info("azure: auto-shutdown schedule written", extra={"vm": vm_name, "at": fire.isoformat()})
        return note

    def remove(self, vm_name: str) -> None:
        """Delete the VM's schedule (missing = done); a refusal is logged, never raised: a schedule left
        behind targets a deleted VM and bills nothing."""
        try:
            self._request("DELETE", f"{self.base}/{schedule_name(vm_name)}")
        except ProviderError as exc:
            get_logger().warning("azure: auto-shutdown schedule not deleted",
                                 extra={"vm": vm_name, "reason": exc.reason[:300]})

    def get(self, vm_name: str) -> dict[str, Any] | None:
        got: dict[str, Any] | None = self._request("GET", f"{self.base}/{schedule_name(vm_name)}")
        return got

    def check(self) -> Check:
        """Whether schedules may be managed in the training resource group: a read of its schedules (the
        optional role grants read, write and delete together; the read creates nothing)."""
        try:
            self._request("GET", self.base)
        except ProviderError as exc:
            if isinstance(exc, AuthError):
                why = (f"the service principal may not manage auto-shutdown schedules in {self.rg}: assign the "
                       "Tensorant Auto-shutdown role (infra/azure/tensorant-autoshutdown-role.json: "
                       f"{', '.join(ACTIONS)}) at the training resource group")
            elif "registration" in exc.reason.lower() or exc.code == "MissingSubscriptionRegistration":
                why = "the Microsoft.DevTestLab resource provider is not registered: register it in the subscription"
            else:
                why = f"the auto-shutdown schedules could not be read ({exc.reason[:200]})"
            return Check(name="auto_shutdown", status=CheckStatus.warn,
                         message=f"Runs launch without the cloud's own backstop: {why}. {WITHOUT[0].upper()}"
                                 f"{WITHOUT[1:]}.")
        return Check(name="auto_shutdown", status=CheckStatus.ok,
                     message="Each VM gets an auto-shutdown schedule that deallocates it at its run's hard deadline "
                             "plus 30 minutes, even if the control plane is gone.")
