"""RunPod compute provider: one single-GPU pod per run.

How it meets shared/providers/base.py's contracts:
- Ownership: RunPod has no tags, so a pod belongs to a run by its exact name
  `tensorant-<deployment>-<run id>--<org>` (pod_name; pods made before the org was in it are
  `tensorant-<deployment>-<run id>`, RunRef.name, and are still the run's). Nothing whose name
  differs is ever stopped, resumed or terminated; list_managed yields only
  `tensorant-<deployment>-*`, with the org the name carries: a pod is attributable to its org
  without the state store (a store lost and rebuilt still finds its org's leaked pods).
- launch is idempotent: the account's pods are listed and a pod with the run's name is
  returned instead of creating another. RunPod can return a pod id for a pod that never
  appears: the id is recorded with its creation time; describe reports it `pending` for
  VISIBILITY_GRACE_S, then `gone`. The caller's provisioning deadline decides; no wait
  here is open-ended and nothing relies on a RunPod-side timer.
- retain = podStop (the pod's /workspace volume is kept; it still bills while stopped);
  start = podResume; release = podTerminate, done only once RunPod no longer returns the
  pod. "Not found" is success.
- Every call goes through client.RunPodApi, which translates vendor errors (errors.py); see there
  for which calls use the runpod package and which send GraphQL variables.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from pydantic import BaseModel

from shared import clock
from shared.errors import CapacityError, PermanentError
from shared.log import register_secret
from shared.models import Check, CloudResource, GpuOffer, MachineState
from shared.org_storage.base import scratch_key
from shared.providers import bootstrap_env, console
from shared.providers.base import CloudProgress, ComputeProvider, Description, LaunchSpec, RunRef, split_attempt
from shared.providers.runpod import catalog, checks
from shared.providers.runpod.catalog import MIN_CUDA, PROVIDER, is_supported_gpu
from shared.providers.runpod.client import (
    CREATE,
    OFFERS,
    POD_ID,
    VOLUMES,
    RunPodApi,
    account,
    balance_of,
    check_pod_id,
    get_pod_query,
    list_pods,
    offers_input,
    resume_mutation,
    stop_mutation,
    terminate_mutation,
)
from shared.providers.runpod.config import RunPodConfig
from shared.providers.runpod.errors import RunPodNotFound
from shared.settings import Settings

DATA_DIR = "/workspace/data"
MOUNT = "/workspace"  # where a pod mounts its volume (the org's network volume, or its own)
# RunPod desiredStatus -> machine state (RUNNING without a runtime is still pending, see _state).
STATE_MAP = {
    "CREATED": MachineState.pending,
    "RUNNING": MachineState.running,
    "EXITED": MachineState.stopped,
    "TERMINATED": MachineState.stopping,  # still returned until RunPod forgets it
}
VISIBILITY_GRACE_S = 120.0  # a just-created pod may not be visible yet
POLL_S = 10.0
_PRESIGNED = ("TENSORANT_DATASET_URL", "TENSORANT_ADAPTER_UPLOAD_URL", "TENSORANT_LOGS_UPLOAD_URL",
              "TENSORANT_MERGED_UPLOAD_URL")
ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")




class RunPodCompute:
    name = PROVIDER

    def __init__(self, config: RunPodConfig, settings: Settings) -> None:
        self.config = config
        self.settings = settings
        self.api = RunPodApi(config.api_key.get_secret_value())
        self.prefix = f"tensorant-{settings.deployment_id}-"

    # ------------------------------------------------------------ scope and credit

    def preflight(self, offer: GpuOffer, ref: RunRef | None = None) -> str | None:
        """Nothing read ahead: RunPod has no quota to read, and its stock is checked by launch itself
        (a pod create that finds none is a CapacityError), so an extra read here would only race it."""
        return None

    def scope(self) -> dict[str, str]:
        """The RunPod account the key belongs to (myself.id). A new key of the same account can
        manage the same pods (rotation); a key of another account cannot."""
        acct_id = str(account(self.api).get("id") or "")
        return {"account": acct_id} if acct_id else {}

    def balance(self) -> float | None:
        """The account's prepaid credit in USD (myself.clientBalance); None when RunPod does not say."""
        return balance_of(account(self.api))

    def credit_warning(self) -> str:
        """A warning while the prepaid credit is low ("" = enough, or RunPod did not say)."""
        have = self.balance()
        if have is None or have >= checks.LOW_BALANCE_USD:
            return ""
        return (f"The RunPod account has only ${have:.2f} of prepaid credit left (below "
                f"${checks.LOW_BALANCE_USD:.0f}): stopped pods keep billing their disk, and RunPod stops and then "
                "deletes the pods of an account without credit. Add credit in RunPod → Billing.")

    def _refuse_without_credit(self, spec: LaunchSpec) -> None:
        """RunPod accounts run on prepaid credit: refuse a launch that the credit cannot cover."""
        if spec.runtime_limit_s <= 0:
            return
        per_hour = spec.price_limit_per_hour or spec.offer.total_per_hour
        need = per_hour * spec.runtime_limit_s / 3600
        have = self.balance()
        if have is not None and have < need:
            raise PermanentError(
                f"the RunPod account has ${have:.2f} of prepaid credit, less than the run may cost: price limit "
                f"${per_hour:.2f}/h x runtime limit {spec.runtime_limit_s / 3600:.2f} h = ${need:.2f}; nothing was "
                "launched. Add credit in RunPod → Billing, or lower the price or runtime limit", code="credit")

    # ------------------------------------------------------------ validate / offers

    def validate(self) -> list[Check]:
        """Every connection check (see checks.py); creates nothing."""
        return checks.run_checks(self.api, self.config, self.prefix)

    def network_volumes(self) -> list[dict[str, Any]]:
        """The account's network volumes (id, name, size GB, dataCenterId), for the storage card's
        "pick a volume" list. Needs network-volume discovery on the key."""
        volumes = (self.api.query(VOLUMES).get("myself") or {}).get("networkVolumes") or []
        return [{"id": str(v.get("id")), "name": str(v.get("name") or ""), "size_gb": int(v.get("size") or 0),
                 "datacenter_id": str(v.get("dataCenterId") or "")} for v in volumes if isinstance(v, dict)]

    def offers(self) -> list[GpuOffer]:
        dc = self.config.datacenter_id or None
        cloud = self._cloud()
        secure = {"SECURE": True, "COMMUNITY": False}.get(cloud)
        data = self.api.query(OFFERS, offers_input(dc=dc, secure=secure, min_cuda=MIN_CUDA))
        pod_volume = 0 if self.config.network_volume_id else self.config.volume_gb
        return catalog.gpu_offers(data.get("gpuTypes") or [], cloud=cloud, dc=dc,
                                  disk_gb=self.config.container_disk_gb + pod_volume)

    # ------------------------------------------------------------ launch

    def launch(self, spec: LaunchSpec) -> list[CloudResource]:
        ref = spec.ref
        self._check_ref(ref)
        gpu_id = spec.offer.machine_type
        if not is_supported_gpu(gpu_id, spec.offer.gpu):
            raise PermanentError(f"{gpu_id} is not an Ampere-or-newer NVIDIA GPU; choose another GPU", code="gpu")
        existing = [p for p in self._list() if is_run_pod(p.get("name"), ref)]
        if existing:
            return [self._resource(ref, p) for p in existing]
        self._refuse_without_credit(spec)
        env = self._pod_env(spec)
        for key, value in env.items():
            if not ENV_KEY.match(key):
                raise PermanentError(f"environment name {key!r} is not valid for a pod", code="env")
            if key in spec.bootstrap.secret_env_keys:
                register_secret(value)
        pod_input: dict[str, Any] = {
            "name": pod_name(ref),
            "imageName": spec.bootstrap.container_image,
            "gpuTypeId": gpu_id,
            "gpuCount": 1,
            "cloudType": self._cloud(),
            "containerDiskInGb": self.config.container_disk_gb,
            "volumeInGb": 0 if self.config.network_volume_id else (spec.disk_gb or self.config.volume_gb),
            "volumeMountPath": MOUNT,
            "env": bootstrap_env.pod_env(env),
            "ports": "",  # no public ports: the agent only calls out
            "supportPublicIp": False,
            "startSsh": True,  # RunPod's basic SSH proxy for manual recovery; opens no port
            "minCudaVersion": MIN_CUDA,  # a host whose driver supports this CUDA version or newer
        }
        if self.config.network_volume_id:
            pod_input["networkVolumeId"] = self.config.network_volume_id
            pod_input["dataCenterId"] = self.config.datacenter_id
        try:
            data = self.api.query(CREATE, {"input": pod_input})
        except CapacityError as exc:
            # RunPod's own words kept (a run's attempts show them): "There are no longer any instances ...".
            raise CapacityError(f"{self._capacity_reason(spec.offer.gpu or gpu_id)} ({exc.reason})",
                                code="capacity") from exc
        pod = data.get("podFindAndDeployOnDemand") or {}
        check_pod_id(str(pod.get("id") or ""))
        pod.setdefault("name", pod_name(ref))
        return [self._resource(ref, pod, created_at=clock.now())]

    def _cloud(self) -> str:
        # Network volumes exist only in Secure Cloud (the service may add a volume to a saved config).
        return "SECURE" if self.config.network_volume_id else self.config.cloud_type

    def _pod_env(self, spec: LaunchSpec) -> dict[str, str]:
        """The agent's environment. With the org's network volume mounted at /workspace the
        agent reads and writes the storage keys as files there: the presigned URLs the
        volume storage also offers are dropped, so the pod holds no storage credential."""
        # TENSORANT_POWEROFF: an agent that stops by itself stops its pod with the pod-scoped RUNPOD_API_KEY
        # RunPod puts in the pod's environment (machine/agent/guard.py).
        env = {"TENSORANT_DATA_DIR": self._data_dir(spec.ref), "TENSORANT_POWEROFF": "runpod", **spec.bootstrap.env}
        if self.config.network_volume_id and "TENSORANT_ADAPTER_KEY" in env:
            for key in _PRESIGNED:
                env.pop(key, None)
            env["TENSORANT_STORAGE_DIR"] = MOUNT
        return env

    def _data_dir(self, ref: RunRef) -> str:
        # A network volume is shared by every pod of the org: keep each run's scratch apart, at the key
        # storage.base.scratch_key names (/workspace/data/<run id>), which the release step removes.
        return f"{MOUNT}/{scratch_key(ref.run_id)}" if self.config.network_volume_id else DATA_DIR

    def _capacity_reason(self, gpu: str) -> str:
        where = f" in datacenter {self.config.datacenter_id}" if self.config.datacenter_id else ""
        reason = (f"RunPod has no {gpu} available{where} right now. "
                  "Choose another GPU in the catalog or try again later.")
        if self.config.datacenter_id:
            reason += " With a RunPod network volume only GPUs in the volume's datacenter can be used."
        return reason

    # ------------------------------------------------------------ describe / retain / start / release

    def describe(self, ref: RunRef, resources: list[CloudResource]) -> Description:
        self._check_ref(ref)
        pods = self._pods(ref, resources)
        if not pods:
            if self._recently_created(resources):
                return Description(state=MachineState.pending,
                                   detail="pod created but not visible in RunPod yet", resources=resources)
            return Description(state=MachineState.gone, detail="no pod for this run exists on RunPod")
        pod = pods[0]
        state = _state(pod)
        detail = f"pod {pod['id']} is {pod.get('desiredStatus', '?')}"
        if len(pods) > 1:
            detail += f"; {len(pods) - 1} more pod(s) carry this run's name and will be released with it"
        return Description(state=state, detail=detail, resources=[self._resource(ref, p) for p in pods],
                           reason=_reason(pod))

    def retain(self, ref: RunRef, resources: list[CloudResource]) -> CloudProgress:
        self._check_ref(ref)
        note = self._stopped_note()
        pods = self._pods(ref, resources)
        if not pods:
            return CloudProgress(done=True, detail="no pod for this run exists on RunPod; nothing to stop", billing_note=note)
        for pod in pods:
            if pod.get("desiredStatus") not in ("EXITED", "TERMINATED"):
                try:
                    self.api.sdk(stop_mutation(pod["id"]))
                except RunPodNotFound:
                    pass
        after = self._pods(ref, resources)
        waiting = [p["id"] for p in after if p.get("desiredStatus") not in ("EXITED", "TERMINATED")]
        if waiting:
            return CloudProgress(done=False, detail=f"stop requested for pod {', '.join(waiting)}; waiting for RunPod",
                           retry_after_s=POLL_S, billing_note=note)
        return CloudProgress(done=True, detail=f"pod {', '.join(p['id'] for p in pods)} stopped; files in /workspace kept",
                       billing_note=note)

    def start(self, ref: RunRef, resources: list[CloudResource]) -> CloudProgress:
        self._check_ref(ref)
        note = "Restarting the pod resumes GPU billing; it does not resume training. Stop it again when done."
        pods = self._pods(ref, resources)
        if not pods:
            raise PermanentError("the run's pod no longer exists on RunPod; there is nothing to start", code="gone")
        for pod in pods:
            if pod.get("desiredStatus") == "EXITED":
                try:
                    self.api.sdk(resume_mutation(pod["id"]))
                except CapacityError as exc:
                    raise CapacityError(
                        "RunPod cannot restart the pod now: its host has no free GPU. Try again later; with a "
                        "network volume you can instead verify the adapter saved on the volume.",
                        code="capacity") from exc
        after = self._pods(ref, resources)
        if all(_state(p) == MachineState.running for p in after):
            return CloudProgress(done=True, detail="pod running again", billing_note=note)
        return CloudProgress(done=False, detail="resume requested; waiting for the pod to run", retry_after_s=POLL_S,
                       billing_note=note)

    def release(self, ref: RunRef, resources: list[CloudResource]) -> CloudProgress:
        self._check_ref(ref)
        kept = " The network volume is kept (and keeps billing): deleting compute never deletes shared storage." \
            if self.config.network_volume_id else ""
        pods = self._pods(ref, resources)
        for pod in pods:
            if pod.get("desiredStatus") == "TERMINATED":
                continue  # asked before; wait for RunPod to stop returning it
            try:
                self.api.sdk(terminate_mutation(pod["id"]))
            except RunPodNotFound:
                pass  # already gone: success
        left = self._pods(ref, resources)
        if left:
            return CloudProgress(done=False, retry_after_s=POLL_S,
                           detail=f"terminate requested for pod {', '.join(p['id'] for p in left)}; "
                                  "waiting for RunPod to confirm it is gone")
        gone = ", ".join(p["id"] for p in pods) or "none found"
        return CloudProgress(done=True, detail=f"RunPod confirms the run's pod is gone ({gone}).{kept}",
                       billing_note="GPU released; nothing of this run bills on RunPod any more." + kept)

    def list_managed(self) -> Iterable[CloudResource]:
        # RunPod returns the account's pods in one answer (no paging in myself.pods).
        for pod in self._list():
            name = str(pod.get("name") or "")
            if name.startswith(self.prefix) and _has_pod_id(pod):
                run_part, _, org = name[len(self.prefix):].partition("--")
                run_id, attempt = split_attempt(run_part)
                yield CloudResource(provider=PROVIDER, kind="pod", id=pod["id"], name=name, run_id=run_id, org=org,
                                    attempt=attempt,
                                    deployment=self.settings.deployment_id, state=str(pod.get("desiredStatus") or ""),
                                    region=self.config.datacenter_id)

    # ------------------------------------------------------------ helpers

    def _check_ref(self, ref: RunRef) -> None:
        if ref.deployment != self.settings.deployment_id:
            raise PermanentError(f"run belongs to deployment {ref.deployment!r}, not {self.settings.deployment_id!r}; "
                                 "its pod is not touched here", code="foreign")

    def _list(self) -> list[dict[str, Any]]:
        return list_pods(self.api)

    def _get(self, pod_id: str) -> dict[str, Any] | None:
        try:
            pod = self.api.sdk(get_pod_query(pod_id)).get("pod")
        except RunPodNotFound:
            return None
        return pod if isinstance(pod, dict) and pod.get("id") else None

    def _pods(self, ref: RunRef, resources: list[CloudResource]) -> list[dict[str, Any]]:
        """Every existing pod of this run: those recorded, plus any listed under its name.

        A recorded pod whose name is not the run's is refused (never touched). A pod RunPod
        reports TERMINATED is counted as existing until RunPod stops returning it.
        """
        found = {p["id"]: p for p in self._list() if is_run_pod(p.get("name"), ref)}
        for res in resources:
            if res.provider != PROVIDER or res.kind != "pod" or res.id in found:
                continue
            pod = self._get(res.id)
            if pod is None:
                continue
            if not is_run_pod(pod.get("name"), ref):
                raise PermanentError(f"pod {res.id} is named {pod.get('name')!r}, not {pod_name(ref)!r}; Tensorant does "
                                     "not touch pods it did not name", code="foreign")
            found[pod["id"]] = pod
        recorded = [r.id for r in resources]
        return sorted(found.values(), key=lambda p: (p["id"] not in recorded, p["id"]))

    def _recently_created(self, resources: list[CloudResource]) -> bool:
        now = clock.now()
        return any(r.created_at is not None and (now - r.created_at).total_seconds() < VISIBILITY_GRACE_S
                   for r in resources if r.provider == PROVIDER and r.kind == "pod")

    def _stopped_note(self) -> str:
        if self.config.network_volume_id:
            return ("Pod stopped: GPU billing has stopped. The pod's container disk and the network volume "
                    f"{self.config.network_volume_id} still bill while it is stopped.")
        return (f"Pod stopped: GPU billing has stopped, but its {self.config.volume_gb} GB volume disk still bills "
                "while stopped (RunPod charges idle volume disk at a higher rate) until the run is released. "
                "To retrieve /workspace/data/adapter.zip, restart the pod first: that resumes GPU billing and "
                "depends on capacity.")

    def _resource(self, ref: RunRef, pod: dict[str, Any], created_at: datetime | None = None) -> CloudResource:
        extra = {k: str(pod[k]) for k in ("imageName", "costPerHr") if pod.get(k) is not None}
        if self.config.network_volume_id:
            extra["networkVolumeId"] = self.config.network_volume_id
        return CloudResource(provider=PROVIDER, kind="pod", id=str(pod["id"]), name=str(pod.get("name") or pod_name(ref)),
                             region=self.config.datacenter_id, run_id=ref.run_id, org=ref.org, attempt=ref.attempt,
                             deployment=ref.deployment, created_at=created_at,
                             state=str(pod.get("desiredStatus") or ""), extra=extra)


def pod_name(ref: RunRef) -> str:
    """The run's pod name: its deployment, run and org (`--` never occurs in a run id this app makes)."""
    return f"{ref.name}--{ref.org}"


def is_run_pod(name: object, ref: RunRef) -> bool:
    """Whether a pod of this name is the run's: named with its org, or before the org was in the name."""
    return name in (pod_name(ref), ref.name)


def _reason(pod: dict[str, Any]) -> str:
    """RunPod's own account of the pod: desiredStatus, lastStatusChange and whether a container runs."""
    parts = [f"RunPod pod {pod.get('id', '?')} desiredStatus {pod.get('desiredStatus', '?')}"]
    if pod.get("lastStatusChange"):
        parts.append(f"last status change: {console.bounded(str(pod['lastStatusChange']), 500)}")
    runtime = pod.get("runtime")
    if isinstance(runtime, dict):
        parts.append(f"container up {runtime.get('uptimeInSeconds', '?')} s")
    else:
        parts.append("no container running (the image is still being pulled, or the host could not start it)")
    return console.bounded("; ".join(parts))  # RunPod's free text, scrubbed and bounded


def _has_pod_id(pod: dict[str, Any]) -> bool:
    return bool(POD_ID.match(str(pod.get("id") or "")))


def _state(pod: dict[str, Any]) -> MachineState:
    status = str(pod.get("desiredStatus"))
    if status == "RUNNING" and not pod.get("runtime"):
        return MachineState.pending  # asked to run, no container up yet
    return STATE_MAP.get(status, MachineState.unknown)


def build(config: BaseModel, settings: Settings) -> ComputeProvider:
    """The registry's factory: mypy checks RunPodCompute against the Protocol here."""
    if not isinstance(config, RunPodConfig):
        raise TypeError(f"runpod needs a RunPodConfig, not {type(config).__name__}")
    return RunPodCompute(config, settings)
