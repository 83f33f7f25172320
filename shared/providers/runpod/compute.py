"""RunPod compute provider: one single-GPU pod per run.

How it meets shared/providers/base.py's contracts:
- Ownership: RunPod has no tags, so a pod belongs to a run by its exact name
  `tensorant-<deployment>-<run id>` (RunRef.name). Nothing whose name differs is ever
  stopped, resumed or terminated; list_managed yields only `tensorant-<deployment>-*`.
- launch is idempotent: the account's pods are listed and a pod with the run's name is
  returned instead of creating another. RunPod can return a pod id for a pod that never
  appears: the id is recorded with its creation time; describe reports it `pending` for
  VISIBILITY_GRACE_S, then `gone`. The caller's provisioning deadline decides; no wait
  here is open-ended and nothing relies on a RunPod-side timer.
- retain = podStop (the pod's /workspace volume is kept; it still bills while stopped);
  start = podResume; release = podTerminate, done only once RunPod no longer returns the
  pod. "Not found" is success.
- Every call goes through graphql.RunPodApi, which translates vendor errors; see there
  for which calls use the runpod package and which send GraphQL variables.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from pydantic import BaseModel

from shared import clock
from shared.log import register_secret
from shared.models import Check, CheckStatus, CloudResource, GpuOffer, MachineState
from shared.providers.base import ComputeProvider, Description, LaunchSpec, Outcome, RunRef
from shared.providers.errors import AuthError, CapacityError, PermanentError, ProviderError
from shared.providers.runpod.config import RunPodConfig
from shared.providers.runpod.graphql import POD_ID, NotFound, RunPodApi, check_pod_id
from shared.settings import Settings

PROVIDER = "runpod"
# A CUDA 13-compatible host: RunPod filters hosts by the CUDA version of their driver.
CUDA_VERSIONS = ["13.0"]
DATA_DIR = "/workspace/data"
MOUNT = "/workspace"
# RunPod list prices (USD per GB-month): container disk and running pod volume.
DISK_GB_MONTH = 0.10
HOURS_PER_MONTH = 730.0
VISIBILITY_GRACE_S = 120.0  # a just-created pod may not be visible yet
POLL_S = 10.0
_PRESIGNED = ("TENSORANT_DATASET_URL", "TENSORANT_ADAPTER_UPLOAD_URL", "TENSORANT_LOGS_UPLOAD_URL")
ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")

# Ampere or newer, NVIDIA only (allow-list: an unknown GPU stays out of the catalog).
# GeForce RTX x050-x090 only: "Quadro RTX 4000/5000" are Turing (RTX 4000/5000 *Ada* match \bAda\b).
_SUPPORTED = re.compile(
    r"\bA(2|10|10G|16|30|40|100)\b|\bA[2-6]\d{3}\b|\bRTX (30|40|50)[5-9]0\b|\bL4\b|\bL40S?\b"
    r"|\bG?H(100|200)\b|\bG?B(100|200|300)\b|\bAda\b|\bBlackwell\b",
)
_NOT_NVIDIA = re.compile(r"\bAMD\b|\bInstinct\b|\bMI\d{3}", re.I)
EXCLUDED_NOTE = ("T4, V100, P100, RTX 20xx and other pre-Ampere or non-NVIDIA GPUs are not offered "
                 "(the trainer needs Ampere or newer)")

_POD_FIELDS = "id name desiredStatus imageName costPerHr gpuCount volumeInGb containerDiskInGb"

_LIST_PODS = "query Pods { myself { pods { " + _POD_FIELDS + " runtime { uptimeInSeconds } } } }"
_ACCOUNT = "query Account { myself { id } }"
_CREATE = (
    "mutation Create($input: PodFindAndDeployOnDemandInput!) { podFindAndDeployOnDemand(input: $input) { "
    + _POD_FIELDS + " } }"
)
_OFFERS = """query Offers($dc: String, $secure: Boolean) {
  gpuTypes { id displayName memoryInGb secureCloud communityCloud securePrice communityPrice
    lowestPrice(input: {gpuCount: 1, dataCenterId: $dc, secureCloud: $secure}) { uninterruptablePrice stockStatus } }
}"""
_VOLUMES = "query Volumes { myself { networkVolumes { id name size dataCenterId } } }"


def _get_pod(pod_id: str) -> str:
    pod_id = check_pod_id(pod_id)  # the only value in this query text, checked to be a plain id
    return 'query Pod { pod(input: {podId: "' + pod_id + '"}) { ' + _POD_FIELDS + " runtime { uptimeInSeconds } } }"


def is_supported_gpu(gpu_id: str, display: str = "") -> bool:
    text = f"{gpu_id} {display}"
    return bool(_SUPPORTED.search(text)) and not _NOT_NVIDIA.search(text)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def looks_like_s3_key(key: str) -> bool:
    """RunPod S3 API keys are `user_...` (access key) and `rps_...` (secret); AWS keys start AKIA/ASIA."""
    return bool(re.match(r"^(rps_|user_|AKIA|ASIA)", key.strip()))


class RunPodCompute:
    name = PROVIDER

    def __init__(self, config: RunPodConfig, settings: Settings) -> None:
        self.config = config
        self.settings = settings
        self.api = RunPodApi(config.api_key.get_secret_value())
        self.prefix = f"tensorant-{settings.deployment_id}-"

    # ------------------------------------------------------------ validate / offers

    def validate(self) -> list[Check]:
        key = self.config.api_key.get_secret_value()
        if looks_like_s3_key(key):
            return [Check(name="api key", status=CheckStatus.fail, message=(
                "This looks like an S3 API key (access key user_…, secret rps_…), not a RunPod API key. "
                "The compute connection needs an API key from RunPod → Settings → API Keys; the S3 key belongs "
                "to the storage connection. They are not interchangeable."))]
        checks: list[Check] = []
        try:
            account = self.api.sdk(_ACCOUNT).get("myself") or {}
            pods = self._list()
        except AuthError as exc:
            return [Check(name="api key", status=CheckStatus.fail, message=exc.reason)]
        except ProviderError as exc:
            return [Check(name="api key", status=CheckStatus.fail, message=f"{exc.reason}; check again later")]
        ours = sum(1 for p in pods if str(p.get("name", "")).startswith(self.prefix))
        checks.append(Check(name="api key", status=CheckStatus.ok,
                            message=f"RunPod accepted the key (account {account.get('id', '?')})"))
        checks.append(Check(name="list pods", status=CheckStatus.ok,
                            message=f"the key can list pods ({len(pods)} in the account, {ours} managed here)"))
        checks.append(Check(name="write permissions", status=CheckStatus.warn, message=(
            "This check cannot prove write permissions (create, start, stop and delete pods) because it creates "
            "nothing. Give the key read/write access to pods: a read-only key cannot launch or clean up runs.")))
        if self.config.network_volume_id:
            checks.append(self._check_volume())
        return checks

    def _check_volume(self) -> Check:
        vid, dc = self.config.network_volume_id, self.config.datacenter_id
        try:
            volumes = (self.api.query(_VOLUMES).get("myself") or {}).get("networkVolumes") or []
        except ProviderError as exc:
            return Check(name="network volume", status=CheckStatus.fail, message=(
                f"cannot list network volumes: {exc.reason}. Allow network-volume discovery on the API key."))
        match = next((v for v in volumes if v.get("id") == vid), None)
        if match is None:
            return Check(name="network volume", status=CheckStatus.fail, message=(
                f"network volume {vid} is not in this RunPod account; check the volume ID in RunPod → Storage"))
        if match.get("dataCenterId") != dc:
            return Check(name="network volume", status=CheckStatus.fail, message=(
                f"network volume {vid} is in {match.get('dataCenterId')}, not {dc}; fix the storage connection"))
        return Check(name="network volume", status=CheckStatus.ok,
                     message=f"network volume {vid} ({match.get('name', '')}) is in {dc}; pods will run there")

    def network_volumes(self) -> list[dict[str, Any]]:
        """The account's network volumes (id, name, size GB, dataCenterId), for the storage card's
        "pick a volume" list. Needs network-volume discovery on the key."""
        volumes = (self.api.query(_VOLUMES).get("myself") or {}).get("networkVolumes") or []
        return [{"id": str(v.get("id")), "name": str(v.get("name") or ""), "size_gb": int(v.get("size") or 0),
                 "datacenter_id": str(v.get("dataCenterId") or "")} for v in volumes if isinstance(v, dict)]

    def offers(self) -> list[GpuOffer]:
        dc = self.config.datacenter_id or None
        cloud = self._cloud()
        secure = {"SECURE": True, "COMMUNITY": False}.get(cloud)
        data = self.api.query(_OFFERS, {"dc": dc, "secure": secure})
        pod_volume = 0 if self.config.network_volume_id else self.config.volume_gb
        disk_gb = self.config.container_disk_gb + pod_volume
        disk_per_hour = round(disk_gb * DISK_GB_MONTH / HOURS_PER_MONTH, 4)
        note = f"Single GPU. {EXCLUDED_NOTE}. Disk: {disk_gb} GB of container disk and pod volume."
        if dc:
            note += f" Only GPUs in the network volume's datacenter {dc}; the volume is billed separately."
        offers: list[GpuOffer] = []
        for gpu in data.get("gpuTypes") or []:
            gpu_id = str(gpu.get("id") or "")
            if not gpu_id or not is_supported_gpu(gpu_id, str(gpu.get("displayName") or "")):
                continue
            lowest = gpu.get("lowestPrice") or {}
            if dc and not lowest.get("stockStatus"):
                continue  # not available in the volume's datacenter
            offered = {"SECURE": gpu.get("secureCloud"), "COMMUNITY": gpu.get("communityCloud")}.get(cloud, True)
            if not offered:
                continue
            price = lowest.get("uninterruptablePrice") or (
                gpu.get("communityPrice") if cloud == "COMMUNITY" else gpu.get("securePrice"))
            if not price or float(price) <= 0:
                continue
            compute = round(float(price), 4)
            offers.append(GpuOffer(
                provider=PROVIDER,
                offer_id=f"runpod-{_slug(cloud)}-{_slug(dc or 'any')}-{_slug(gpu_id)}",
                gpu=str(gpu.get("displayName") or gpu_id),
                gpu_memory_gb=float(gpu.get("memoryInGb") or 0),
                machine_type=gpu_id,
                region=dc or "any",
                compute_per_hour=compute,
                disk_per_hour=disk_per_hour,
                total_per_hour=round(compute + disk_per_hour, 4),
                note=note,
            ))
        return sorted(offers, key=lambda o: (o.total_per_hour, o.gpu))

    # ------------------------------------------------------------ launch

    def launch(self, spec: LaunchSpec) -> list[CloudResource]:
        ref = spec.ref
        self._check_ref(ref)
        gpu_id = spec.offer.machine_type
        if not is_supported_gpu(gpu_id, spec.offer.gpu):
            raise PermanentError(f"{gpu_id} is not an Ampere-or-newer NVIDIA GPU; choose another GPU", code="gpu")
        existing = [p for p in self._list() if p.get("name") == ref.name]
        if existing:
            return [self._resource(ref, p) for p in existing]
        env = self._pod_env(spec)
        for key, value in env.items():
            if not ENV_KEY.match(key):
                raise PermanentError(f"environment name {key!r} is not valid for a pod", code="env")
            if key in spec.bootstrap.secret_env_keys:
                register_secret(value)
        pod_input: dict[str, Any] = {
            "name": ref.name,
            "imageName": spec.bootstrap.container_image,
            "gpuTypeId": gpu_id,
            "gpuCount": 1,
            "cloudType": self._cloud(),
            "containerDiskInGb": self.config.container_disk_gb,
            "volumeInGb": 0 if self.config.network_volume_id else (spec.disk_gb or self.config.volume_gb),
            "volumeMountPath": MOUNT,
            "env": [{"key": k, "value": v} for k, v in env.items()],
            "ports": "",  # no public ports: the agent only calls out
            "supportPublicIp": False,
            "startSsh": True,  # RunPod's basic SSH proxy for manual recovery; opens no port
            "allowedCudaVersions": CUDA_VERSIONS,
        }
        if self.config.network_volume_id:
            pod_input["networkVolumeId"] = self.config.network_volume_id
            pod_input["dataCenterId"] = self.config.datacenter_id
        try:
            data = self.api.query(_CREATE, {"input": pod_input})
        except CapacityError as exc:
            raise CapacityError(self._capacity_reason(spec.offer.gpu or gpu_id), code="capacity") from exc
        pod = data.get("podFindAndDeployOnDemand") or {}
        check_pod_id(str(pod.get("id") or ""))
        pod.setdefault("name", ref.name)
        return [self._resource(ref, pod, created_at=clock.now())]

    def _cloud(self) -> str:
        # Network volumes exist only in Secure Cloud (the service may add a volume to a saved config).
        return "SECURE" if self.config.network_volume_id else self.config.cloud_type

    def _pod_env(self, spec: LaunchSpec) -> dict[str, str]:
        """The agent's environment. With the org's network volume mounted at /workspace the
        agent reads and writes the storage keys as files there: the presigned URLs the
        volume storage also offers are dropped, so the pod holds no storage credential."""
        env = {"TENSORANT_DATA_DIR": self._data_dir(spec.ref), **spec.bootstrap.env}
        if self.config.network_volume_id and "TENSORANT_ADAPTER_KEY" in env:
            for key in _PRESIGNED:
                env.pop(key, None)
            env["TENSORANT_STORAGE_DIR"] = MOUNT
        return env

    def _data_dir(self, ref: RunRef) -> str:
        # A network volume is shared by every pod of the org: keep each run's scratch apart.
        return f"{DATA_DIR}/{ref.run_id}" if self.config.network_volume_id else DATA_DIR

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
        return Description(state=state, detail=detail, resources=[self._resource(ref, p) for p in pods])

    def retain(self, ref: RunRef, resources: list[CloudResource]) -> Outcome:
        self._check_ref(ref)
        note = self._stopped_note()
        pods = self._pods(ref, resources)
        if not pods:
            return Outcome(done=True, detail="no pod for this run exists on RunPod; nothing to stop", billing_note=note)
        for pod in pods:
            if pod.get("desiredStatus") not in ("EXITED", "TERMINATED"):
                try:
                    self.api.sdk(_stop(pod["id"]))
                except NotFound:
                    pass
        after = self._pods(ref, resources)
        waiting = [p["id"] for p in after if p.get("desiredStatus") not in ("EXITED", "TERMINATED")]
        if waiting:
            return Outcome(done=False, detail=f"stop requested for pod {', '.join(waiting)}; waiting for RunPod",
                           retry_after_s=POLL_S, billing_note=note)
        return Outcome(done=True, detail=f"pod {', '.join(p['id'] for p in pods)} stopped; files in /workspace kept",
                       billing_note=note)

    def start(self, ref: RunRef, resources: list[CloudResource]) -> Outcome:
        self._check_ref(ref)
        note = "Restarting the pod resumes GPU billing; it does not resume training. Stop it again when done."
        pods = self._pods(ref, resources)
        if not pods:
            raise PermanentError("the run's pod no longer exists on RunPod; there is nothing to start", code="gone")
        for pod in pods:
            if pod.get("desiredStatus") == "EXITED":
                try:
                    self.api.sdk(_resume(pod["id"]))
                except CapacityError as exc:
                    raise CapacityError(
                        "RunPod cannot restart the pod now: its host has no free GPU. Try again later; with a "
                        "network volume you can instead verify the adapter saved on the volume.",
                        code="capacity") from exc
        after = self._pods(ref, resources)
        if all(_state(p) == MachineState.running for p in after):
            return Outcome(done=True, detail="pod running again", billing_note=note)
        return Outcome(done=False, detail="resume requested; waiting for the pod to run", retry_after_s=POLL_S,
                       billing_note=note)

    def release(self, ref: RunRef, resources: list[CloudResource]) -> Outcome:
        self._check_ref(ref)
        kept = " The network volume is kept (and keeps billing): deleting compute never deletes shared storage." \
            if self.config.network_volume_id else ""
        pods = self._pods(ref, resources)
        for pod in pods:
            if pod.get("desiredStatus") == "TERMINATED":
                continue  # asked before; wait for RunPod to stop returning it
            try:
                self.api.sdk(_terminate(pod["id"]))
            except NotFound:
                pass  # already gone: success
        left = self._pods(ref, resources)
        if left:
            return Outcome(done=False, retry_after_s=POLL_S,
                           detail=f"terminate requested for pod {', '.join(p['id'] for p in left)}; "
                                  "waiting for RunPod to confirm it is gone")
        gone = ", ".join(p["id"] for p in pods) or "none found"
        return Outcome(done=True, detail=f"RunPod confirms the run's pod is gone ({gone}).{kept}",
                       billing_note="GPU released; nothing of this run bills on RunPod any more." + kept)

    def list_managed(self) -> Iterable[CloudResource]:
        # RunPod returns the account's pods in one answer (no paging in myself.pods).
        for pod in self._list():
            name = str(pod.get("name") or "")
            if name.startswith(self.prefix) and _has_pod_id(pod):
                run_id = name[len(self.prefix):]
                yield CloudResource(provider=PROVIDER, kind="pod", id=pod["id"], name=name, run_id=run_id,
                                    deployment=self.settings.deployment_id, state=str(pod.get("desiredStatus") or ""),
                                    region=self.config.datacenter_id)

    # ------------------------------------------------------------ helpers

    def _check_ref(self, ref: RunRef) -> None:
        if ref.deployment != self.settings.deployment_id:
            raise PermanentError(f"run belongs to deployment {ref.deployment!r}, not {self.settings.deployment_id!r}; "
                                 "its pod is not touched here", code="foreign")

    def _list(self) -> list[dict[str, Any]]:
        pods = (self.api.sdk(_LIST_PODS).get("myself") or {}).get("pods") or []
        return [p for p in pods if isinstance(p, dict) and _has_pod_id(p)]

    def _get(self, pod_id: str) -> dict[str, Any] | None:
        try:
            pod = self.api.sdk(_get_pod(pod_id)).get("pod")
        except NotFound:
            return None
        return pod if isinstance(pod, dict) and pod.get("id") else None

    def _pods(self, ref: RunRef, resources: list[CloudResource]) -> list[dict[str, Any]]:
        """Every existing pod of this run: those recorded, plus any listed under its name.

        A recorded pod whose name is not the run's is refused (never touched). A pod RunPod
        reports TERMINATED is counted as existing until RunPod stops returning it.
        """
        found = {p["id"]: p for p in self._list() if p.get("name") == ref.name}
        for res in resources:
            if res.provider != PROVIDER or res.kind != "pod" or res.id in found:
                continue
            pod = self._get(res.id)
            if pod is None:
                continue
            if pod.get("name") != ref.name:
                raise PermanentError(f"pod {res.id} is named {pod.get('name')!r}, not {ref.name!r}; Tensorant does "
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
        return CloudResource(provider=PROVIDER, kind="pod", id=str(pod["id"]), name=str(pod.get("name") or ref.name),
                             region=self.config.datacenter_id, run_id=ref.run_id, org=ref.org,
                             deployment=ref.deployment, created_at=created_at,
                             state=str(pod.get("desiredStatus") or ""), extra=extra)


def _has_pod_id(pod: dict[str, Any]) -> bool:
    return bool(POD_ID.match(str(pod.get("id") or "")))


def _state(pod: dict[str, Any]) -> MachineState:
    status = pod.get("desiredStatus")
    if status == "RUNNING":
        return MachineState.running if pod.get("runtime") else MachineState.pending
    return {"CREATED": MachineState.pending, "EXITED": MachineState.stopped,
            "TERMINATED": MachineState.stopping}.get(str(status), MachineState.unknown)


def _stop(pod_id: str) -> str:
    from runpod.api.mutations.pods import generate_pod_stop_mutation

    return str(generate_pod_stop_mutation(check_pod_id(pod_id)))


def _resume(pod_id: str) -> str:
    from runpod.api.mutations.pods import generate_pod_resume_mutation

    return str(generate_pod_resume_mutation(check_pod_id(pod_id), 1))


def _terminate(pod_id: str) -> str:
    from runpod.api.mutations.pods import generate_pod_terminate_mutation

    return str(generate_pod_terminate_mutation(check_pod_id(pod_id)))


def build(config: BaseModel, settings: Settings) -> ComputeProvider:
    """The registry's factory: mypy checks RunPodCompute against the Protocol here."""
    if not isinstance(config, RunPodConfig):
        raise TypeError(f"runpod needs a RunPodConfig, not {type(config).__name__}")
    return RunPodCompute(config, settings)
