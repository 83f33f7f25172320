"""On moto: the scope a run records (account + region), EC2's own reason in describe and its
console output (console_of), launches refused when temporary credentials expire before the run's
deadlines, the recovery-login warning and the control-plane URL in the egress list the checks show."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta
from typing import Any, TypedDict

import pytest

from shared.errors import PermanentError
from shared.log import register_secret
from shared.models import CheckStatus, CloudResource
from shared.providers.base import LaunchSpec, RunRef, console_of, scope_of
from tests.providers.aws.rig import ACCOUNT, AMI_GOOD, REGION, Rig, add_injection, inject
from tests.providers.aws.test_lifecycle import BOOT, OFFER

REF = RunRef("test", "org-1", "run-scope")


def test_scope_is_the_account_and_region_of_the_credentials(rig: Rig) -> None:
    compute = rig.compute()
    assert scope_of(compute) == {"account": ACCOUNT, "region": REGION}
    scope_of(compute)
    assert [op for _, op in rig.log.take()] == ["GetCallerIdentity"]  # read once per provider


def test_describe_carries_ec2s_state_reason(rig: Rig) -> None:
    compute = rig.compute()
    resources = compute.launch(LaunchSpec(ref=REF, offer=OFFER, bootstrap=BOOT))
    iid = next(r.id for r in resources if r.kind == "instance")
    running = compute.describe(REF, resources)
    assert running.reason.startswith(f"EC2 instance {iid} is running")
    assert "console output" in running.reason  # no reason given: say where to look
    rig.ec2.stop_instances(InstanceIds=[iid])
    stopped = compute.describe(REF, resources)
    assert "state reason Client.UserInitiatedShutdown" in stopped.reason, stopped.reason
    assert "transition: User initiated" in stopped.reason


def test_a_disk_ec2_could_not_encrypt_names_the_kms_grants() -> None:
    # A customer-managed default EBS key without the grants: pending -> terminated, Client.InternalError.
    from shared.providers.aws.compute import AwsCompute

    reason = AwsCompute._reason({"InstanceId": "i-1", "State": {"Name": "terminated"}, "StateReason": {
        "Code": "Client.InternalError", "Message": "Client.InternalError: Client error on launch"}})
    assert "state reason Client.InternalError" in reason
    for grant in ("kms:CreateGrant", "kms:Decrypt", "kms:GenerateDataKeyWithoutPlaintext", "kms:ReEncrypt*",
                  "kms:DescribeKey", "default EBS encryption key"):
        assert grant in reason, reason


def _run_instance(rig: Rig, tags: dict[str, str]) -> list[CloudResource]:
    """The run's instance as launch leaves it (tagged at creation), made directly on moto."""
    inst = rig.ec2.run_instances(ImageId=AMI_GOOD, MinCount=1, MaxCount=1, InstanceType="g6.xlarge",
                                 TagSpecifications=[{"ResourceType": "instance", "Tags": [
                                     {"Key": k, "Value": v} for k, v in tags.items()]}])["Instances"][0]
    return [CloudResource(provider="aws", kind="instance", id=inst["InstanceId"], run_id=REF.run_id)]


def test_console_output_is_the_last_lines_of_ec2s_console(rig: Rig) -> None:
    compute = rig.compute()
    assert console_of(compute, REF, []) == ""  # no instance: nothing to read
    resources = _run_instance(rig, REF.tags)
    iid = resources[0].id
    text = console_of(compute, REF, resources)
    assert text.startswith(f"EC2 console output of {iid} (last lines):\n"), text
    assert text.endswith("Kernel command line: root=/dev/sda1 ro 4\nEnabling fast FPU save and restore... done.")
    assert ("ec2", "GetConsoleOutput") in rig.log.calls


def test_console_output_is_scrubbed_and_bounded(rig: Rig, injected: list[Any]) -> None:
    compute = rig.compute()
    resources = _run_instance(rig, REF.tags)
    register_secret("run-token-value-0123456789")
    lines = [f"boot line {i} " + "x" * 200 for i in range(40)]
    lines += ["\x1b[31mdocker: pull failed\x1b[0m", "curl -H 'Authorization: Bearer run-token-value-0123456789'",
              "TENSORANT_BOOTSTRAP=eyJydW4iOiAicjEifQ==", "", "\x07last line"]
    # As EC2 sends it (base64); botocore's after-call handler decodes it for the adapter.
    sent = {"InstanceId": "i-x", "Output": base64.b64encode("\r\n".join(lines).encode()).decode()}
    add_injection(injected, inject("ec2", "GetConsoleOutput", response=sent))
    text = console_of(compute, REF, resources)
    assert text.endswith("docker: pull failed\ncurl -H 'Authorization: Bearer ***'\nTENSORANT_BOOTSTRAP=***\n"
                         "last line"), text
    assert "run-token-value" not in text and "\x1b" not in text and "boot line 29" not in text
    assert len(text) <= 1600


def test_console_output_unavailable_never_raises(rig: Rig, injected: list[Any]) -> None:
    compute = rig.compute()
    resources = _run_instance(rig, REF.tags)
    add_injection(injected, inject("ec2", "GetConsoleOutput", "UnauthorizedOperation", "not allowed", status=403))
    text = console_of(compute, REF, resources)
    assert text.startswith("console output unavailable: ") and "ec2:GetConsoleOutput" in text, text
    # Another deployment's instance (recorded by id, tags differ): its console is never read.
    foreign = _run_instance(rig, {**REF.tags, "tensorant:deployment": "other"})
    calls = len(rig.log.calls)
    assert console_of(compute, REF, foreign).startswith("console output unavailable: refusing to read")
    assert ("ec2", "GetConsoleOutput") not in rig.log.calls[calls:]


class _Session(TypedDict):
    """Temporary credentials: the AwsConfig fields an STS session adds to the rig's keys."""

    access_key_id: str
    session_token: str
    session_expires_at: datetime


def _session(expires_in: timedelta) -> _Session:
    return {"access_key_id": "ASIAIOSFODNN7EXAMPLE", "session_token": "FwoGZXIvYXdzEXAMPLETOKEN",
            "session_expires_at": datetime.now(UTC) + expires_in}


def test_launch_refused_when_the_session_expires_before_the_deadlines(rig: Rig) -> None:
    compute = rig.compute(**_session(timedelta(hours=1)))
    until = datetime.now(UTC) + timedelta(hours=3)
    spec = LaunchSpec(ref=REF, offer=OFFER, bootstrap=BOOT, runtime_limit_s=7200, must_work_until=until)
    with pytest.raises(PermanentError) as err:
        compute.launch(spec)
    reason = err.value.reason
    assert err.value.code == "CredentialsExpireTooSoon"
    assert "expire at" in reason and until.strftime("%Y-%m-%d %H:%M UTC") in reason and "7200 s" in reason
    assert "120 min longer" in reason or "119 min longer" in reason
    assert "RunInstances" not in [op for _, op in rig.log.take()]  # nothing was launched
    # Credentials that outlive the deadlines launch.
    ok = rig.compute(**_session(timedelta(hours=4)))
    assert "instance" in {r.kind for r in ok.launch(spec)}


def test_no_key_pair_and_no_instance_profile_warns_no_recovery_login(rig: Rig) -> None:
    checks = {c.name: c for c in rig.compute().validate()}
    assert checks["recovery_login"].status == CheckStatus.warn
    assert "no recovery login" in checks["recovery_login"].message
    rig.ec2.create_key_pair(KeyName="ops")
    assert "recovery_login" not in {c.name for c in rig.compute(key_name="ops").validate()}


def test_egress_list_names_the_control_plane_url(rig: Rig) -> None:
    from shared.providers.aws.compute import AwsCompute
    from shared.settings import Settings

    compute = AwsCompute(rig.config(), Settings(deployment_id="test", public_url="https://tensorant.example.com"),
                         endpoint_url=rig.url, pricing_endpoint_url=rig.pricing.url, sleep=lambda s: None)
    message = {c.name: c for c in compute.validate()}["not_proven"].message
    assert "control plane at https://tensorant.example.com" in message and "heartbeats" in message
