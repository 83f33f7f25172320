"""What an owner saves for AWS compute. Imports no SDK.

Every validator rejects at once with a message that says what to paste instead,
so a wrong value never reaches the checks that call AWS.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

_REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d{1,2}$")
_AMI = re.compile(r"^ami-([0-9a-f]{8}|[0-9a-f]{17})$")
_SUBNET = re.compile(r"^subnet-([0-9a-f]{8}|[0-9a-f]{17})$")
_SG = re.compile(r"^sg-([0-9a-f]{8}|[0-9a-f]{17})$")
_ACCESS_KEY = re.compile(r"^(AKIA|ASIA)[A-Z0-9]{12,124}$")
_KEY_NAME = re.compile(r"^[\x20-\x7e]{1,255}$")
# arn:aws:iam::<12 digits>:instance-profile/<optional path/>name
_PROFILE_ARN = re.compile(r"^arn:aws:iam::(\d{12}):instance-profile/([\w+=,.@/-]{1,512})$")
# Loose on purpose: anything shaped like a role ARN gets the "paste the profile ARN" hint.
_ROLE_ARN = re.compile(r"^arn:aws[\w-]*:iam::(\d+):role/(.+)$")

MIN_WORKSPACE_GB = 10
MAX_WORKSPACE_GB = 16000 - 200  # gp3 maximum is 16 TiB; leave room for the image itself


class AwsConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    region: str = Field(description="Commercial AWS region, e.g. us-east-1")
    access_key_id: str = Field(description="The IAM user's access key ID (AKIA...), of the policy in infra/aws")
    secret_access_key: SecretStr = Field(description="The access key's secret")
    session_token: SecretStr | None = Field(default=None, description="Only for temporary credentials (STS)")
    # When the pasted credentials are temporary, their Expiration (as printed by
    # `aws sts get-session-token` or `aws configure export-credentials`). The token
    # itself is opaque, so this is the only way to show the expiry.
    session_expires_at: datetime | None = Field(default=None, description="When temporary credentials expire")
    ami_id: str = Field(description="The training image (AMI) in this region, e.g. ami-0abc...")
    subnet_id: str = Field(description="The subnet the machines start in (subnet-...), in this region")
    security_group_id: str = Field(description="A security group with no inbound rules (sg-...)")
    key_name: str | None = Field(default=None, description="Optional: an EC2 key pair's name, for SSH to a retained machine")
    instance_profile_arn: str | None = Field(default=None, description=(
        "Optional: the machines' instance profile ARN (S3 access without keys)"))
    workspace_disk_gb: int = Field(default=100, ge=MIN_WORKSPACE_GB, le=MAX_WORKSPACE_GB,
                                   description="The workspace disk (gp3) in GiB")

    @field_validator("region")
    @classmethod
    def _region(cls, v: str) -> str:
        v = v.strip()
        if v.startswith("cn-"):
            raise ValueError(f"{v} is an AWS China region, which this connector does not support; "
                             "use a commercial region such as us-east-1")
        if v.startswith("us-gov-"):
            raise ValueError(f"{v} is an AWS GovCloud region, which this connector does not support; "
                             "use a commercial region such as us-east-1")
        if "-iso" in v:
            raise ValueError(f"{v} is an isolated AWS partition; use a commercial region such as us-east-1")
        if not _REGION.match(v):
            raise ValueError(f"{v!r} is not an AWS region code; paste the code, e.g. us-east-1 or eu-west-1")
        return v

    @field_validator("access_key_id")
    @classmethod
    def _access_key(cls, v: str) -> str:
        v = v.strip()
        if not _ACCESS_KEY.match(v):
            raise ValueError("not an AWS access key ID; paste the ID that starts with AKIA "
                             "(IAM user access key) or ASIA (temporary credentials)")
        return v

    @field_validator("ami_id")
    @classmethod
    def _ami(cls, v: str) -> str:
        v = v.strip()
        if not _AMI.match(v):
            raise ValueError(f"{v!r} is not an AMI ID; paste the image ID, e.g. ami-0123456789abcdef0")
        return v

    @field_validator("subnet_id")
    @classmethod
    def _subnet(cls, v: str) -> str:
        v = v.strip()
        if not _SUBNET.match(v):
            raise ValueError(f"{v!r} is not a subnet ID; paste the private subnet's ID, "
                             "e.g. subnet-0123456789abcdef0 (not its name or CIDR)")
        return v

    @field_validator("security_group_id")
    @classmethod
    def _sg(cls, v: str) -> str:
        v = v.strip()
        if not _SG.match(v):
            raise ValueError(f"{v!r} is not a security group ID; paste the group's ID, "
                             "e.g. sg-0123456789abcdef0 (not its name)")
        return v

    @field_validator("key_name")
    @classmethod
    def _key_name(cls, v: str | None) -> str | None:
        if v is None or v == "":
            return None
        if not _KEY_NAME.match(v):
            raise ValueError("not an EC2 key-pair name; paste the exact name shown in EC2 → Key pairs")
        if v.startswith("key-"):
            raise ValueError(f"{v!r} looks like a key-pair ID; paste the key pair's name instead")
        return v

    @field_validator("instance_profile_arn")
    @classmethod
    def _profile(cls, v: str | None) -> str | None:
        if v is None or v == "":
            return None
        v = v.strip()
        role = _ROLE_ARN.match(v)
        if role:
            account, name = role.groups()
            base = name.rsplit("/", 1)[-1]
            raise ValueError(
                "this is a role ARN; paste the instance profile ARN instead, which looks like "
                f"arn:aws:iam::{account}:instance-profile/{base} "
                "(IAM → Roles → the role → 'Instance profile ARN')")
        if v.startswith(("arn:aws-cn:", "arn:aws-us-gov:")):
            raise ValueError("China and GovCloud ARNs are not supported; use a profile in a commercial account")
        if not _PROFILE_ARN.match(v):
            raise ValueError("not an instance profile ARN; paste one like "
                             "arn:aws:iam::123456789012:instance-profile/NAME")
        return v

    @model_validator(mode="after")
    def _temporary_keys_need_token(self) -> AwsConfig:
        token = self.session_token.get_secret_value() if self.session_token else ""
        if self.access_key_id.startswith("ASIA") and not token:
            raise ValueError("access keys starting with ASIA are temporary; paste their session token too, "
                             "or use an IAM user's long-term access key (AKIA…)")
        return self

    @property
    def instance_profile_name(self) -> str | None:
        if not self.instance_profile_arn:
            return None
        return self.instance_profile_arn.rsplit("/", 1)[-1]

    def warnings(self) -> list[str]:
        """Things the owner must know about a config that is otherwise accepted."""
        out: list[str] = []
        token = self.session_token.get_secret_value() if self.session_token else ""
        if token:
            expiry = "Their expiry could not be read; add the credentials' expiration time to show it."
            if self.session_expires_at is not None:
                at = self.session_expires_at
                if at.tzinfo is None:
                    at = at.replace(tzinfo=UTC)
                expiry = f"They expire at {at.astimezone(UTC).strftime('%Y-%m-%d %H:%M UTC')}."
            out.append(
                "These are temporary credentials (session token). Tensorant does not renew STS sessions: "
                "they must stay valid until every run and retained instance is cleaned up, or those "
                f"instances cannot be stopped or terminated. {expiry} Prefer an IAM user's access key.")
        return out
