"""The agent's self-protection: when to stop training and power the machine off by itself.

The control plane enforces every time limit, by stopping the machine through the cloud. When it
is gone (an outage, a lost state store, a deleted deployment) or wrong, nothing else would bound
the customer's bill, so the agent bounds it: past the run's runtime limit (counted from this
agent's start) or its deadline at launch, plus a margin; after no heartbeat got through for
TENSORANT_UNREACHABLE_STOP_S; or after the control plane answered 404/410 for the run (it no
longer knows it) for TENSORANT_GONE_GRACE_S. The margin and bounds are well beyond the control
plane's own (heartbeat timeout 600 s): a control plane that works always acts first.

It then stops the trainer (its last checkpoint is uploaded), uploads its logs, records the stop,
and powers the machine off, keeping the disk (machine.agent.agent.Agent.self_stop), so the worst
case is the disk's bill, never the GPU's:
- "exit" (AWS and Azure VMs: cloud-init's script runs the container): the agent exits with
  POWEROFF_EXIT and the host script runs `poweroff`. On AWS the instance was launched with
  InstanceInitiatedShutdownBehavior=stop: it stops, its EBS disk kept, GPU billing ends. On
  Azure a guest poweroff leaves the VM "Stopped", still allocated and still billed for compute
  until something deallocates it (the control plane's retain once it is back, or the owner);
  only the training stops. Deallocating from inside would need the VM's own identity with a
  deallocate role, which the connection does not create.
- "runpod": the pod stops itself with RunPod's API, using the pod-scoped RUNPOD_API_KEY and
  RUNPOD_POD_ID that RunPod puts in every pod's environment (podStop: the GPU is freed, the
  volume kept and billed as a stopped pod's).
- "" (the local provider, tests): nothing is powered off; the agent idles.
Standard library only, like the rest of the agent.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable, Mapping

from machine.agent.config import AgentConfig

POWEROFF_EXIT = 80  # the agent's exit code that asks cloud-init's script to power the machine off
GONE = (404, 410)  # the control plane's answers for a run it does not know
RUNPOD_GRAPHQL = "https://api.runpod.io"


class Guard:
    """Tracks what the agent heard from the control plane; says when it must stop by itself."""

    def __init__(self, config: AgentConfig, *, resumed: bool = False,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        self.config = config
        self.clock = clock
        self.wall = wall
        self.started = clock()
        self.last_heard = self.started
        self.gone_since: float | None = None
        # The deadline at launch no longer holds after a resume (the control plane counts the runtime
        # limit again from the resume); the limit counted from this agent's start still does.
        self.resumed = resumed

    def heard(self, ok: bool, status: int = 0) -> None:
        """After each call to the control plane: ok, or the HTTP status it refused with (0: no answer)."""
        t = self.clock()
        if ok:
            self.last_heard, self.gone_since = t, None
        elif status in GONE:
            self.last_heard = t  # it answered: reachable, but it does not know the run
            if self.gone_since is None:
                self.gone_since = t

    def reason(self, *, working: bool) -> str:
        """Why the agent must stop now ("" = it need not). `working`: preparing, training or exporting;
        an idle agent (reported, or stopped) is bounded by the runtime limit alone."""
        c = self.config
        t = self.clock()
        if c.runtime_limit_s and t - self.started > c.runtime_limit_s + c.self_stop_margin_s:
            return (f"the run's runtime limit ({c.runtime_limit_s:.0f} s) and a margin of {c.self_stop_margin_s:.0f} s "
                    "have passed on this machine and the control plane has not stopped it")
        if c.deadline_at and not self.resumed and self.wall() > c.deadline_at + c.self_stop_margin_s:
            return (f"the run's deadline and a margin of {c.self_stop_margin_s:.0f} s have passed and the control "
                    "plane has not stopped it")
        if not working:
            return ""
        if self.gone_since is not None and t - self.gone_since > c.gone_grace_s:
            return (f"the control plane has answered for {t - self.gone_since:.0f} s that it does not know this run "
                    "(404/410)")
        if c.unreachable_stop_s and t - self.last_heard > c.unreachable_stop_s:
            return f"the control plane has been unreachable for {t - self.last_heard:.0f} s"
        return ""


def stop_runpod_pod(environ: Mapping[str, str], log: Callable[[str], None]) -> bool:
    """podStop of this pod with the pod-scoped key RunPod gives it. True when RunPod accepted it."""
    pod, key = environ.get("RUNPOD_POD_ID", ""), environ.get("RUNPOD_API_KEY", "")
    if not pod or not key or not pod.isalnum():
        log("cannot stop the pod: RUNPOD_POD_ID or RUNPOD_API_KEY is not in its environment")
        return False
    base = (environ.get("RUNPOD_API_BASE_URL") or RUNPOD_GRAPHQL).rstrip("/")
    body = json.dumps({"query": f'mutation {{ podStop(input: {{podId: "{pod}"}}) {{ id desiredStatus }} }}'})
    request = urllib.request.Request(f"{base}/graphql", data=body.encode(), method="POST", headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            answer = json.loads(response.read() or b"{}")
    except Exception as exc:  # every failure is logged; the agent idles instead
        log(f"RunPod did not stop the pod: {type(exc).__name__}")
        return False
    if not isinstance(answer, dict) or answer.get("errors"):
        log("RunPod refused to stop the pod")
        return False
    return True
