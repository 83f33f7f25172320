"""AwsConfig rejects wrong values at once, with a message that says what to paste."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from shared.providers.aws.config import AwsConfig

GOOD: dict[str, Any] = {
    "region": "us-east-1", "access_key_id": "AKIAIOSFODNN7EXAMPLE",
    "secret_access_key": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "ami_id": "ami-0123456789abcdef0",
    "subnet_id": "subnet-0123456789abcdef0", "security_group_id": "sg-0123456789abcdef0",
}


def _error(**over: Any) -> str:
    with pytest.raises(ValidationError) as info:
        AwsConfig(**{**GOOD, **over})
    return str(info.value)


def test_good_config_has_no_warnings_and_hides_the_secret() -> None:
    cfg = AwsConfig(**GOOD, key_name="ops", instance_profile_arn="arn:aws:iam::123456789012:instance-profile/ssm/x")
    assert cfg.warnings() == []
    assert "wJalr" not in repr(cfg)
    assert cfg.instance_profile_name == "x"
    assert cfg.workspace_disk_gb == 100


@pytest.mark.parametrize("region,word", [("cn-north-1", "China"), ("cn-northwest-1", "China"),
                                         ("us-gov-west-1", "GovCloud"), ("us-gov-east-1", "GovCloud"),
                                         ("US East", "us-east-1")])
def test_region_rejected(region: str, word: str) -> None:
    assert word in _error(region=region)


@pytest.mark.parametrize("field,value,hint", [
    ("ami_id", "ami-xyz", "ami-0123456789abcdef0"),
    ("ami_id", "i-0123456789abcdef0", "AMI ID"),
    ("subnet_id", "subnet-12", "subnet-0123456789abcdef0"),
    ("subnet_id", "10.0.1.0/24", "not its name or CIDR"),
    ("security_group_id", "default", "sg-0123456789abcdef0"),
    ("security_group_id", "sg-XYZ00000", "security group ID"),
    ("access_key_id", "not-a-key", "AKIA"),
    ("key_name", "key-0123456789abcdef0", "key pair's name"),
])
def test_malformed_ids_rejected(field: str, value: str, hint: str) -> None:
    assert hint in _error(**{field: value})


def test_role_arn_rejected_with_the_profile_arn_to_paste() -> None:
    msg = _error(instance_profile_arn="arn:aws:iam::123456789012:role/service/TensorantSSM")
    assert "role ARN" in msg
    assert "arn:aws:iam::123456789012:instance-profile/TensorantSSM" in msg
    assert "arn:aws:iam::123:instance-profile/x" in _error(instance_profile_arn="arn:aws:iam::123:role/x")
    assert "instance-profile" in _error(instance_profile_arn="TensorantSSM")


def test_workspace_bounds() -> None:
    assert "greater than or equal" in _error(workspace_disk_gb=1)


def test_extra_fields_forbidden() -> None:
    assert "Extra inputs" in _error(spot=True)


def test_temporary_keys_need_a_token_and_warn_with_expiry() -> None:
    assert "session token" in _error(access_key_id="ASIAIOSFODNN7EXAMPLE")
    cfg = AwsConfig(**{**GOOD, "access_key_id": "ASIAIOSFODNN7EXAMPLE"}, session_token="FwoGZXIvYXdzEJr//tok",
                    session_expires_at=datetime(2026, 12, 2, 6, 30, tzinfo=UTC))
    [warning] = cfg.warnings()
    assert "not renew" in warning and "retained" in warning
    assert "2026-12-02 06:30 UTC" in warning
    [unknown] = AwsConfig(**GOOD, session_token="FwoGZXIvYXdzEJr//tok").warnings()
    assert "could not be read" in unknown


def test_importing_the_config_loads_no_sdk() -> None:
    code = ("import sys, shared.providers.aws.config, shared.providers.aws.catalog, "
            "shared.providers.aws.pricing, shared.providers.aws.errors; "
            "assert 'boto3' not in sys.modules and 'botocore' not in sys.modules, sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)
