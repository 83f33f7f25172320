"""AWS EC2 compute: one on-demand single-GPU instance per run, in the customer's account.

How it meets the ComputeProvider contracts (shared/providers/base.py):
- Every AWS request goes through client.AwsClient (the one door to boto3), which retries
  throttling (bounded, exponential backoff with full jitter, then ThrottledError) and
  translates vendor errors (errors.translate); capacity errors are never retried.
- launch is idempotent: DescribeInstances by the run's tags first, then RunInstances
  with a ClientToken derived from the run and the request's parameters (AWS returns the
  same instance for the same token and parameters even when the tag lookup missed a
  brand-new instance; the user data is the same on every attempt: cloudinit.py). Tags are set in
  RunInstances' TagSpecifications for the instance and its volume, never later.
- retain stops (done at "stopped"), start starts, release terminates; each first reads
  the instance and refuses one without this deployment's and run's tags. release is
  done only when the instance is terminated (or not found) and the run's tagged root
  volume is gone.
- boto3 is imported only when a client is first needed (client.py); lookups live in
  catalog.py, prices in pricing.py, connection checks in checks.py.
- console_output (optional, see base.console_of): the last lines of GetConsoleOutput for an
  instance that never reported, scrubbed and bounded (shared/providers/console.py).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel

from shared.errors import AuthError, PermanentError, ProviderError
from shared.log import get_logger, register_secret
from shared.models import Check, CloudResource, GpuOffer, MachineState
from shared.providers import bootstrap_env, cloudinit, console
from shared.providers.aws import catalog, checks, pricing, quotas
from shared.providers.aws.client import ApiCallHook, AwsClient
from shared.providers.aws.config import AwsConfig
from shared.providers.aws.errors import NOT_FOUND_CODES
from shared.providers.base import (
    TAG_DEPLOYMENT,
    TAG_MANAGED,
    TAG_ORG,
    TAG_RUN,
    CloudProgress,
    ComputeProvider,
    Description,
    LaunchSpec,
    RunRef,
    attempt_of_tags,
    marks_extra,
)
from shared.settings import Settings

LIVE_STATES = ["pending", "running", "stopping", "stopped"]
STATE_MAP = {
    "pending": MachineState.pending,
    "running": MachineState.running,
    "stopping": MachineState.stopping,
    "shutting-down": MachineState.stopping,
    "stopped": MachineState.stopped,
    "terminated": MachineState.gone,
}
RETAIN_BILLING = ("EC2 compute billing stopped when the instance reached 'stopped'; its root EBS volume "
                  "({size}) still bills until the run is released.")
START_BILLING = ("The instance is starting again: EC2 compute billing resumes while it runs. "
                 "Training does not resume; recover the adapter, then stop or release the run.")


# EC2's only word for an encrypted volume it could not create (pending -> terminated at once): the root
# disk is encrypted with the account's default EBS key, and a customer-managed one needs these grants.
KMS_HINT = ("EC2 says Client.InternalError when it cannot encrypt the instance's disk: if the account's default "
            "EBS encryption key (EC2 -> Settings -> EBS encryption) is a customer-managed KMS key, the connection's "
            "IAM user needs kms:CreateGrant, kms:Decrypt, kms:GenerateDataKeyWithoutPlaintext, kms:ReEncrypt* and "
            "kms:DescribeKey on that key (infra/aws/README.md)")


def block_device_mappings(image: dict[str, Any], workspace_gb: int) -> list[dict[str, Any]]:
    """One encrypted gp3 root disk (the AMI's root size plus the workspace), deleted with the
    instance; the AMI's secondary disks are suppressed: they would be created untracked."""
    root_name = image.get("RootDeviceName") or "/dev/sda1"
    mappings: list[dict[str, Any]] = [{
        "DeviceName": root_name,
        "Ebs": {"VolumeSize": catalog.root_size_gb(image) + workspace_gb, "VolumeType": "gp3",
                "Encrypted": True, "DeleteOnTermination": True},
    }]
    for m in image.get("BlockDeviceMappings") or []:
        name = m.get("DeviceName")
        if name and name != root_name:
            mappings.append({"DeviceName": name, "NoDevice": ""})
    return mappings


def client_token(ref: RunRef, params: dict[str, Any]) -> str:
    """The run and the request's every other parameter, hashed (EC2 allows 64 ASCII characters).

    EC2 answers the same token with different parameters (user data included) with
    IdempotentParameterMismatch, so a token fixed per run failed every retry whose parameters
    changed; a retry with the same parameters still gets the same instance back."""
    request = json.dumps({k: v for k, v in params.items() if k != "ClientToken"}, sort_keys=True, default=str)
    return "tensorant-" + hashlib.sha256(f"{ref.deployment}:{ref.run_id}:{request}".encode()).hexdigest()[:48]


def _tags(obj: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in obj.get("Tags") or []}


def _utc(value: Any) -> datetime | None:
    return value.astimezone(UTC) if isinstance(value, datetime) else None


class AwsCompute:
    name = "aws"
    first_report_s = cloudinit.FIRST_REPORT_S  # the claim's exchange is the first report (cloudinit.py)

    def __init__(self, config: AwsConfig, settings: Settings, *, endpoint_url: str | None = None,
                 pricing_endpoint_url: str | None = None, sleep: Callable[[float], None] = time.sleep,
                 on_api_call: ApiCallHook | None = None, page_size: int = 100) -> None:
        self.config = config
        self.settings = settings
        self.region = config.region
        self.page_size = page_size  # MaxResults of list_managed's pages (EC2 allows 5..1000)
        self.aws = AwsClient(config, endpoint_url=endpoint_url, pricing_endpoint_url=pricing_endpoint_url,
                             sleep=sleep, on_api_call=on_api_call)
        # The client's two verbs, under the names every method below uses.
        self.call = self.aws.call
        self.pages = self.aws.pages
        self._account = ""

    # ------------------------------------------------------------------ scope

    def scope(self) -> dict[str, str]:
        """The account and region these credentials create instances in (STS GetCallerIdentity,
        which needs no permission; read once per provider)."""
        if not self._account:
            ident = self.call("sts", "get_caller_identity", action="reading the account of the credentials")
            self._account = str(ident.get("Account", ""))
        return {"account": self._account, "region": self.region}

    # ------------------------------------------------------------------ Protocol: validate / offers

    def offers(self) -> list[GpuOffer]:
        zone = catalog.subnet(self.aws, self.config.subnet_id)["AvailabilityZone"]
        types = catalog.gpu_types(self.aws, zone)
        if not types:
            raise PermanentError(f"{zone} offers none of the supported GPU types (single A10G, L4, L40S, "
                                 "A100, H100 class); use a subnet in another availability zone")
        disk_gb = catalog.root_size_gb(catalog.image(self.aws, self.config.ami_id)) + self.config.workspace_disk_gb
        return pricing.gpu_offers(pricing.pager(self.aws), self.region, zone, types, disk_gb)

    def validate(self) -> list[Check]:
        """Every connection check (see checks.py); launches nothing."""
        return checks.run_checks(self.aws, self.config, self.settings.public_url)

    def preflight(self, offer: GpuOffer, ref: RunRef | None = None) -> str | None:
        """Why `offer` cannot start under the region's On-Demand vCPU quota of its family, or None
        (quotas.py: read only with the optional servicequotas:GetServiceQuota grant). A read, never
        raises; an instance of `ref` already running is its own, never a reason."""
        if offer.region and offer.region != self.region:
            return None  # another region's offer: launch refuses it with its own reason
        return quotas.preflight(self.aws, offer.machine_type, (TAG_RUN, ref.run_id) if ref else None)

    # ------------------------------------------------------------------ Protocol: launch

    def _refuse_short_session(self, spec: LaunchSpec) -> None:
        """Temporary credentials that expire before the run's deadlines end would leave an
        instance nobody can stop or terminate: refuse, with the figures."""
        expires = self.config.session_expires_at
        if expires is None or spec.must_work_until is None or self.config.session_token is None:
            return
        expires = expires if expires.tzinfo else expires.replace(tzinfo=UTC)
        if expires >= spec.must_work_until:
            return
        fmt = "%Y-%m-%d %H:%M UTC"
        short = int((spec.must_work_until - expires).total_seconds() // 60)
        raise PermanentError(
            f"the connection's temporary credentials expire at {expires.astimezone(UTC).strftime(fmt)}, but the run "
            f"must stay manageable until {spec.must_work_until.astimezone(UTC).strftime(fmt)} (provisioning + runtime "
            f"limit of {spec.runtime_limit_s} s + export margin), {short} min longer; nothing was launched. Save the "
            "connection with credentials valid that long (better: an IAM user's access key), or lower the runtime "
            "limit", code="CredentialsExpireTooSoon")

    def launch(self, spec: LaunchSpec) -> list[CloudResource]:
        ref = spec.ref
        self._refuse_short_session(spec)
        # This attempt's instance only: an earlier attempt's (another candidate's) is not this one's machine.
        existing = [i for i in self._instances_by_tags(ref, states=LIVE_STATES)
                    if attempt_of_tags(_tags(i)) == ref.attempt]
        if existing:
            return self._resources(ref, existing[0])
        for key in spec.bootstrap.secret_env_keys:
            register_secret(spec.bootstrap.env.get(key))
        try:
            user_data = cloudinit.render(spec.bootstrap, bootstrap_env.claim(ref.org, ref.run_id))
        except ValueError as exc:
            raise PermanentError(f"cannot build the instance's user data: {exc}") from exc
        image = catalog.image(self.aws, self.config.ami_id)
        if image.get("RootDeviceType") != "ebs":
            raise PermanentError(f"AMI {self.config.ami_id} has no EBS root disk; use an EBS-backed AMI")
        mappings = block_device_mappings(image, spec.disk_gb or self.config.workspace_disk_gb)
        tags = [{"Key": k, "Value": v} for k, v in ref.tags.items()] + [{"Key": "Name", "Value": ref.name}]
        params: dict[str, Any] = {
            "ImageId": self.config.ami_id,
            "InstanceType": spec.offer.machine_type,
            "MinCount": 1,
            "MaxCount": 1,
            "NetworkInterfaces": [{
                "DeviceIndex": 0, "SubnetId": self.config.subnet_id, "Groups": [self.config.security_group_id],
                "AssociatePublicIpAddress": False, "DeleteOnTermination": True,
            }],
            # IMDSv2 only, and a hop limit of 1: the token PUT's answer cannot cross the docker
            # bridge, so the training container cannot reach the instance profile's credentials
            # (the agent on the host still can). The container runs on the default bridge network.
            "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled", "HttpPutResponseHopLimit": 1},
            "BlockDeviceMappings": mappings,
            # A shutdown from inside the VM stops it, so the disk with the adapter survives.
            "InstanceInitiatedShutdownBehavior": "stop",
            "TagSpecifications": [{"ResourceType": "instance", "Tags": tags},
                                  {"ResourceType": "volume", "Tags": tags}],
            "UserData": user_data,
        }
        if self.config.key_name:
            params["KeyName"] = self.config.key_name
        if self.config.instance_profile_arn:
            params["IamInstanceProfile"] = {"Arn": self.config.instance_profile_arn}
        params["ClientToken"] = client_token(ref, params)
        result = self.call("ec2", "run_instances", action=f"launching {spec.offer.machine_type}",
                           instance_type=spec.offer.machine_type, zone=spec.offer.zone, **params)
        instance = result["Instances"][0]
        get_logger().info("aws instance launched", extra={"instance_id": instance["InstanceId"],
                                                          "instance_type": spec.offer.machine_type})
        return self._resources(ref, instance)

    def _resources(self, ref: RunRef, instance: dict[str, Any]) -> list[CloudResource]:
        """The instance and the volumes EC2 reports attached (at launch they may not be listed yet)."""
        tags = _tags(instance)
        common: dict[str, Any] = {"provider": "aws", "region": self.region, "run_id": tags.get(TAG_RUN, ref.run_id),
                  "org": tags.get(TAG_ORG, ref.org), "deployment": tags.get(TAG_DEPLOYMENT, ref.deployment)}
        common["attempt"] = attempt_of_tags(tags) if tags else ref.attempt
        out = [CloudResource(
            kind="instance", id=instance["InstanceId"], name=tags.get("Name", ref.name),
            created_at=_utc(instance.get("LaunchTime")), state=instance.get("State", {}).get("Name", ""),
            extra={"instance_type": instance.get("InstanceType", ""),
                   "zone": instance.get("Placement", {}).get("AvailabilityZone", "")}, **common)]
        for m in instance.get("BlockDeviceMappings") or []:
            ebs = m.get("Ebs") or {}
            if ebs.get("VolumeId"):
                out.append(CloudResource(
                    kind="volume", id=ebs["VolumeId"], name=tags.get("Name", ref.name),
                    created_at=_utc(ebs.get("AttachTime") or instance.get("LaunchTime")), state=ebs.get("Status", ""),
                    extra={"instance_id": instance["InstanceId"], "device": m.get("DeviceName", ""),
                           "delete_on_termination": str(bool(ebs.get("DeleteOnTermination"))).lower()},
                    **common))
        return out

    # ------------------------------------------------------------------ Protocol: describe / retain / start / release

    def _instances_by_tags(self, ref: RunRef, states: list[str] | None = None) -> list[dict[str, Any]]:
        filters = [{"Name": f"tag:{TAG_RUN}", "Values": [ref.run_id]},
                   {"Name": f"tag:{TAG_DEPLOYMENT}", "Values": [ref.deployment]}]
        if states:
            filters.append({"Name": "instance-state-name", "Values": states})
        return [i for r in self.pages("ec2", "describe_instances", "Reservations", Filters=filters)
                for i in r.get("Instances") or []]

    def _find(self, ref: RunRef, resources: list[CloudResource]) -> list[dict[str, Any]]:
        """The run's instances: by recorded ID when known (checked for tags later), else by tags."""
        ids = [r.id for r in resources if r.provider == "aws" and r.kind == "instance"]
        if not ids:
            return self._instances_by_tags(ref)
        # A filter (not InstanceIds) so a vanished ID yields nothing instead of an error.
        return [i for r in self.pages("ec2", "describe_instances", "Reservations",
                                      Filters=[{"Name": "instance-id", "Values": ids}])
                for i in r.get("Instances") or []]

    @staticmethod
    def _require_owned(instance: dict[str, Any], ref: RunRef, verb: str) -> None:
        tags = _tags(instance)
        if (tags.get(TAG_MANAGED) != "true" or tags.get(TAG_DEPLOYMENT) != ref.deployment
                or tags.get(TAG_RUN) != ref.run_id):
            raise PermanentError(
                f"refusing to {verb} {instance['InstanceId']}: it does not carry this deployment's tags "
                f"({TAG_MANAGED}=true, {TAG_DEPLOYMENT}={ref.deployment}, {TAG_RUN}={ref.run_id}); "
                "Tensorant never touches instances it did not create.", code="NotOwned")

    def describe(self, ref: RunRef, resources: list[CloudResource]) -> Description:
        instances = [i for i in self._find(ref, resources) if i["State"]["Name"] != "terminated"]
        if not instances:
            return Description(state=MachineState.gone, detail="no live instance for this run")
        inst = instances[0]
        name = inst["State"]["Name"]
        return Description(state=STATE_MAP.get(name, MachineState.unknown), detail=f"EC2 state {name}",
                           resources=self._resources(ref, inst), reason=self._reason(inst))

    @staticmethod
    def _reason(inst: dict[str, Any]) -> str:
        """EC2's own account of the instance: its state, StateReason and StateTransitionReason."""
        parts = [f"EC2 instance {inst.get('InstanceId', '?')} is {inst['State']['Name']}"]
        why = inst.get("StateReason") or {}
        if why.get("Code") or why.get("Message"):
            parts.append(f"state reason {why.get('Code', '')}: {why.get('Message', '')}".rstrip(": "))
        if why.get("Code") == "Client.InternalError":
            parts.append(KMS_HINT)
        if inst.get("StateTransitionReason"):
            parts.append(f"transition: {inst['StateTransitionReason']}")
        if len(parts) == 1:
            parts.append("EC2 gives no state reason (the instance runs: check its console output in EC2 for a "
                         "boot, cloud-init, Docker or network problem; the VM must reach the control-plane URL)")
        return console.bounded("; ".join(parts))

    def console_output(self, ref: RunRef, resources: list[CloudResource]) -> str:
        """The last lines of the instance's console (GetConsoleOutput, Latest=True: the newest 64 KB on
        Nitro instances, every GPU type offered), for a machine that never reported; see
        base.console_of. Read only from an instance with this run's tags. "" when no instance is
        left; never raises ("console output unavailable: <why>")."""
        try:
            live = [i for i in self._find(ref, resources) if i["State"]["Name"] != "terminated"]
            if not live:
                return ""
            inst = live[0]
            self._require_owned(inst, ref, "read the console of")
            iid = inst["InstanceId"]
            try:
                out = self.call("ec2", "get_console_output", InstanceId=iid, Latest=True,
                                action=f"reading the console output of {iid}")
            except ProviderError as exc:
                if exc.code != "UnsupportedOperation":  # not a Nitro instance: no "latest", the boot-time copy
                    raise
                out = self.call("ec2", "get_console_output", InstanceId=iid,
                                action=f"reading the console output of {iid}")
        except ProviderError as exc:
            hint = " (the IAM policy needs ec2:GetConsoleOutput, see infra/aws)" if isinstance(exc, AuthError) else ""
            return console.UNAVAILABLE + console.bounded(exc.reason, 300) + hint
        text = str(out.get("Output") or "")  # EC2 sends it base64-encoded; botocore decodes it (after-call handler)
        if not text.strip():
            return f"EC2 has no console output for {iid} yet (it is kept from shortly after boot)"
        return f"EC2 console output of {iid} (last lines):\n" + console.tail_lines(text)

    @staticmethod
    def _root_size_text(instance: dict[str, Any], resources: list[CloudResource]) -> str:
        vols = [m["Ebs"]["VolumeId"] for m in instance.get("BlockDeviceMappings") or [] if m.get("Ebs")]
        vols = vols or [r.id for r in resources if r.kind == "volume"]
        return f"volume {', '.join(vols)}" if vols else "the root volume"

    def retain(self, ref: RunRef, resources: list[CloudResource]) -> CloudProgress:
        instances = self._find(ref, resources)
        live = [i for i in instances if i["State"]["Name"] != "terminated"]
        if not live:
            return CloudProgress(done=True, detail="the instance is already terminated; its root disk is gone and "
                           "nothing is retained", billing_note="Nothing of this run bills any more.")
        inst = live[0]
        self._require_owned(inst, ref, "stop")
        iid = inst["InstanceId"]
        state = inst["State"]["Name"]
        note = RETAIN_BILLING.format(size=self._root_size_text(inst, resources))
        if state == "stopped":
            return CloudProgress(done=True, detail=f"{iid} is stopped", billing_note=note)
        if state == "shutting-down":
            return CloudProgress(done=True, detail=f"{iid} is being terminated; nothing can be retained",
                           billing_note="The instance is terminating; its root disk is deleted with it.")
        if state in ("pending", "running"):
            try:
                result = self.call("ec2", "stop_instances", InstanceIds=[iid], action=f"stopping {iid}")
                state = result["StoppingInstances"][0]["CurrentState"]["Name"]
            except ProviderError as exc:
                if exc.code != "IncorrectInstanceState":  # still pending: ask again shortly
                    raise
        if state == "stopped":
            return CloudProgress(done=True, detail=f"{iid} is stopped", billing_note=note)
        return CloudProgress(done=False, detail=f"{iid} is {state}; waiting for EC2 to confirm 'stopped'",
                       retry_after_s=15.0)

    def start(self, ref: RunRef, resources: list[CloudResource]) -> CloudProgress:
        live = [i for i in self._find(ref, resources) if i["State"]["Name"] != "terminated"]
        if not live:
            raise PermanentError("the run's instance no longer exists; there is nothing to start")
        inst = live[0]
        self._require_owned(inst, ref, "start")
        iid = inst["InstanceId"]
        state = inst["State"]["Name"]
        if state == "stopped":
            itype = inst.get("InstanceType", "")
            result = self.call("ec2", "start_instances", InstanceIds=[iid], action=f"starting {iid}",
                               instance_type=itype, zone=inst.get("Placement", {}).get("AvailabilityZone", ""))
            state = result["StartingInstances"][0]["CurrentState"]["Name"]
        if state == "running":
            return CloudProgress(done=True, detail=f"{iid} is running", billing_note=START_BILLING)
        if state in ("stopping", "shutting-down"):
            return CloudProgress(done=False, detail=f"{iid} is {state}; it can start once stopped", retry_after_s=15.0)
        return CloudProgress(done=False, detail=f"{iid} is {state}", retry_after_s=10.0, billing_note=START_BILLING)

    def release(self, ref: RunRef, resources: list[CloudResource]) -> CloudProgress:
        instances = self._find(ref, resources)
        pending: list[str] = []
        for inst in instances:
            state = inst["State"]["Name"]
            if state == "terminated":
                continue
            self._require_owned(inst, ref, "terminate")
            iid = inst["InstanceId"]
            if state != "shutting-down":
                try:
                    result = self.call("ec2", "terminate_instances", InstanceIds=[iid],
                                       action=f"terminating {iid}")
                    state = result["TerminatingInstances"][0]["CurrentState"]["Name"]
                except ProviderError as exc:
                    if exc.code not in NOT_FOUND_CODES:  # vanished between describe and terminate: done
                        raise
                    state = "terminated"
            if state != "terminated":
                pending.append(f"{iid} is {state}")
        if pending:
            return CloudProgress(done=False, detail="; ".join(pending) + "; waiting for EC2 to confirm 'terminated'",
                           retry_after_s=10.0)
        return self._confirm_volumes_gone(ref, resources, instances)

    def _confirm_volumes_gone(self, ref: RunRef, resources: list[CloudResource],
                              instances: list[dict[str, Any]]) -> CloudProgress:
        filters = [{"Name": f"tag:{TAG_RUN}", "Values": [ref.run_id]},
                   {"Name": f"tag:{TAG_DEPLOYMENT}", "Values": [ref.deployment]}]
        try:
            volumes = list(self.pages("ec2", "describe_volumes", "Volumes", Filters=filters))
        except AuthError as exc:
            if exc.code != "UnauthorizedOperation":
                raise
            # The guide's minimal policy lacks ec2:DescribeVolumes. The root volume was created
            # with DeleteOnTermination=true, and EC2 deletes such volumes with the instance.
            recorded = [r for r in resources if r.kind == "volume"]
            if all(r.extra.get("delete_on_termination", "true") == "true" for r in recorded):
                return CloudProgress(done=True, detail="instance terminated; its root volume was created with "
                               "DeleteOnTermination and is deleted with it (ec2:DescribeVolumes is not granted, "
                               "so the deletion was not read back)")
            raise
        # The attempt's own volumes: a later attempt's machine (the sweeper releasing an abandoned one) keeps its.
        left = [v for v in volumes if v.get("State") != "deleted" and attempt_of_tags(_tags(v)) == ref.attempt]
        if not left:
            done = ", ".join(i["InstanceId"] for i in instances) or "no instance found"
            return CloudProgress(done=True, detail=f"terminated ({done}); the run's volumes are gone")
        text = ", ".join(f"{v['VolumeId']} ({v.get('State')})" for v in left)
        if all(v.get("State") == "deleting" for v in left):
            return CloudProgress(done=False, detail=f"waiting for EC2 to delete {text}", retry_after_s=10.0)
        return CloudProgress(done=False, detail=f"the instance is terminated but volume {text} still exists; delete it "
                       "in EC2 → Volumes (it was kept, e.g. DeleteOnTermination was changed), then retry release",
                       retry_after_s=60.0)

    # ------------------------------------------------------------------ Protocol: list_managed

    def list_managed(self) -> Iterable[CloudResource]:
        filters = [{"Name": f"tag:{TAG_MANAGED}", "Values": ["true"]},
                   {"Name": f"tag:{TAG_DEPLOYMENT}", "Values": [self.settings.deployment_id]}]
        for reservation in self.pages("ec2", "describe_instances", "Reservations",
                                      Filters=filters, MaxResults=self.page_size):
            for inst in reservation.get("Instances") or []:
                if inst["State"]["Name"] == "terminated":
                    continue
                tags = _tags(inst)
                yield self._managed(tags, kind="instance", id=inst["InstanceId"], created_at=_utc(inst.get("LaunchTime")),
                                    state=inst["State"]["Name"],
                                    extra={"instance_type": inst.get("InstanceType", "")})
        try:
            for vol in self.pages("ec2", "describe_volumes", "Volumes", Filters=filters, MaxResults=self.page_size):
                tags = _tags(vol)
                attached = [a.get("InstanceId", "") for a in vol.get("Attachments") or []]
                yield self._managed(tags, kind="volume", id=vol["VolumeId"], created_at=_utc(vol.get("CreateTime")),
                                    state=vol.get("State", ""),
                                    extra={"instance_id": attached[0] if attached else "",
                                           "size_gb": str(vol.get("Size", ""))})
        except AuthError as exc:
            if exc.code != "UnauthorizedOperation":
                raise
            get_logger().warning("aws list_managed: ec2:DescribeVolumes not granted; volumes not listed")

    def _managed(self, tags: dict[str, str], *, kind: str, id: str, created_at: datetime | None, state: str,
                 extra: dict[str, str]) -> CloudResource:
        return CloudResource(provider="aws", kind=kind, id=id, name=tags.get("Name", ""), region=self.region,
                             run_id=tags.get(TAG_RUN, ""), org=tags.get(TAG_ORG, ""),
                             deployment=tags.get(TAG_DEPLOYMENT, ""), managed=tags.get(TAG_MANAGED) == "true",
                             created_at=created_at, state=state, attempt=attempt_of_tags(tags),
                             extra={**extra, **marks_extra(tags)})


def build(config: BaseModel, settings: Settings, **deps: Any) -> ComputeProvider:
    """The registry's factory: mypy checks AwsCompute against the Protocol here."""
    if not isinstance(config, AwsConfig):
        raise TypeError(f"aws needs an AwsConfig, not {type(config).__name__}")
    return AwsCompute(config, settings, **deps)
