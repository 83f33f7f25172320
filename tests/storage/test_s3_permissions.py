"""Probe checks against moto in server mode with IAM auth on: each failure names its fix."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from shared.models import CheckStatus
from shared.org_storage.config import RunPodVolumeConfig, S3StorageConfig
from shared.org_storage.runpod_volume import RunPodVolumeStorage
from shared.org_storage.s3 import S3Storage
from tests.storage.moto_s3 import start_moto_with_auth

ROOT = {"region_name": "us-east-1", "aws_access_key_id": "AKIAROOT0000", "aws_secret_access_key": "x" * 40}


@pytest.fixture(scope="module")
def auth_moto() -> Iterator[tuple[str, dict[str, Any]]]:
    setup_calls = 7  # the calls below run before auth is enforced
    proc, url = start_moto_with_auth(setup_calls)
    iam = boto3.client("iam", endpoint_url=url, **ROOT)
    keys = {}
    for user, actions in (("reader", ["s3:GetObject"]), ("writer", ["s3:PutObject", "s3:DeleteObject"])):
        iam.create_user(UserName=user)
        keys[user] = iam.create_access_key(UserName=user)["AccessKey"]
        iam.put_user_policy(UserName=user, PolicyName="p", PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": actions, "Resource": "*"}]}))
    boto3.client("s3", endpoint_url=url, **ROOT).create_bucket(Bucket="locked-bucket")
    yield url, keys
    proc.terminate()
    proc.wait(10)


def s3(url: str, access: str, secret: str) -> S3Storage:
    return S3Storage(S3StorageConfig(endpoint=url, region="us-east-1", bucket="locked-bucket", prefix="t",
                                     access_key_id=access, secret_access_key=secret))  # type: ignore[arg-type]


def test_read_only_key_fails_write_with_permission_hint(auth_moto: tuple[str, dict[str, Any]]) -> None:
    url, keys = auth_moto
    checks = s3(url, keys["reader"]["AccessKeyId"], keys["reader"]["SecretAccessKey"]).validate()
    assert checks[0].status == CheckStatus.fail
    assert "allow s3:PutObject, s3:GetObject and s3:DeleteObject on locked-bucket/t/*" in checks[0].message


def test_key_without_read_reports_read_failure(auth_moto: tuple[str, dict[str, Any]]) -> None:
    url, keys = auth_moto
    checks = s3(url, keys["writer"]["AccessKeyId"], keys["writer"]["SecretAccessKey"]).validate()
    assert [(c.name, c.status) for c in checks] == [
        ("write", CheckStatus.ok), ("read", CheckStatus.fail), ("delete", CheckStatus.warn)]
    assert "lacks permission" in checks[1].message


def test_wrong_secret_and_unknown_key(auth_moto: tuple[str, dict[str, Any]]) -> None:
    url, keys = auth_moto
    wrong = s3(url, keys["reader"]["AccessKeyId"], "not-the-secret-0123456789").validate()
    assert "secret access key does not match" in wrong[0].message
    unknown = s3(url, "AKIANOBODY000001", "x" * 40).validate()
    assert "access key ID is not known" in unknown[0].message


def test_volume_with_unknown_key_points_to_s3_api_keys(auth_moto: tuple[str, dict[str, Any]]) -> None:
    url, _ = auth_moto
    cfg = RunPodVolumeConfig(volume_id="lockedvol", datacenter_id="EU-RO-1", access_key_id="user_2f21CfO73Mm2",
                             secret_access_key="rps_NOTREAL0123456789")  # type: ignore[arg-type]
    checks = RunPodVolumeStorage(cfg, endpoint=url).validate()
    assert checks[0].status == CheckStatus.fail and "S3 API Keys" in checks[0].message
