"""The checks run after an AWS connection is saved. Each is a named result with a fix hint.

Saving launches nothing: every call here is a read (STS caller identity, Describe*, IAM
GetInstanceProfile, Pricing GetProducts). A last check (warn) says what a save cannot prove.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC
from typing import Any

from shared.clock import now
from shared.errors import AuthError, ProviderError
from shared.models import Check, CheckStatus
from shared.providers.aws import catalog, pricing, quotas
from shared.providers.aws.client import AwsClient
from shared.providers.aws.config import AwsConfig
from shared.providers.aws.errors import AUTH_CODES


def run_checks(client: AwsClient, config: AwsConfig, public_url: str = "") -> list[Check]:
    """Every connection check, through the client; creates nothing. public_url is the control
    plane's URL (TENSORANT_PUBLIC_URL), which the instances must reach for heartbeats."""
    return _Checks(client, config, public_url).run()


def egress_text(public_url: str) -> str:
    """The outbound destinations a training instance needs (the same list as infra/aws/README.md)."""
    plane = f"the Tensorant control plane at {public_url}" if public_url else "the Tensorant control plane URL"
    return (f"{plane} (heartbeats and completion: without it every run stops at its provisioning deadline), the "
            "training container registry, model downloads, the storage endpoint, and DNS")


KMS_GRANTS = ("With a customer-managed key, this IAM user needs kms:CreateGrant, kms:Decrypt, "
              "kms:GenerateDataKeyWithoutPlaintext, kms:ReEncrypt* and kms:DescribeKey on it (the key policy or an "
              "IAM policy), or every instance goes pending -> terminated with Client.InternalError.")


class _Checks:
    def __init__(self, client: AwsClient, config: AwsConfig, public_url: str = "") -> None:
        self.aws = client
        self.config = config
        self.region = config.region
        self.public_url = public_url

    def run(self) -> list[Check]:
        checks: list[Check] = []

        def add(name: str, ok: bool | None, message: str) -> None:
            status = CheckStatus.warn if ok is None else (CheckStatus.ok if ok else CheckStatus.fail)
            checks.append(Check(name=name, status=status, message=message))

        account = self._check_credentials(add)
        if account is not None:
            self._check_ebs_key(add)
            image = self._check_image(add)
            subnet = self._check_network(add)
            types: list[catalog.GpuType] = []
            if subnet is not None:
                types = self._check_zone(add, subnet["AvailabilityZone"])
            if self.config.key_name:
                self._check_key_pair(add)
            if self.config.instance_profile_arn:
                self._check_profile(add, account)
            if not self.config.key_name and not self.config.instance_profile_arn:
                add("recovery_login", None, "Neither an EC2 key pair nor an instance profile is set, so there is "
                    "no recovery login: a retained instance can be restarted but nobody can log in to fetch its "
                    "adapter. Add a key pair name (SSH) or an instance profile ARN (Systems Manager); see the "
                    "guide's 'Arrange a recovery login'.")
            if types and image is not None:
                try:
                    disk_gb = catalog.root_size_gb(image) + self.config.workspace_disk_gb
                    offers = pricing.gpu_offers(pricing.pager(self.aws), self.region,
                                                subnet["AvailabilityZone"] if subnet else "", types, disk_gb)
                    cheapest = min(offers, key=lambda o: o.total_per_hour)
                    add("catalog", True, f"{len(offers)} GPU types priced; from {cheapest.machine_type} "
                        f"({cheapest.gpu}) at ${cheapest.total_per_hour:.3f}/hour.")
                except ProviderError as exc:
                    add("catalog", False, f"The GPU catalog could not be priced: {exc.reason} The Pricing API "
                        "is called in us-east-1; check that pricing:GetProducts is allowed and that no "
                        "account policy blocks us-east-1.")
            else:
                add("catalog", False, "The GPU catalog cannot load until the AMI and subnet checks pass.")
            quota_ok, quota_text = quotas.check(self.aws)  # optional grant: a warning when refused
            add("quota_preflight", quota_ok, quota_text)
        add("not_proven", None,
            "Saving launches nothing, so it cannot prove that the image boots, that Docker and the NVIDIA "
            "runtime work, that your GPU quota suffices, or that the subnet's outbound network works. The "
            f"security group and subnet must allow outbound HTTPS to {egress_text(self.public_url)}. "
            "Verify them with a short training trial (connection guide, step 6).")
        return checks

    def _check_ebs_key(self, add: Callable[[str, bool | None, str], None]) -> None:
        """The root disk is encrypted with the account's default EBS key. A customer-managed one needs KMS
        grants for these credentials, or every instance goes pending -> terminated with Client.InternalError."""
        try:
            key = str(self.aws.call("ec2", "get_ebs_default_kms_key_id",
                                    action="reading the account's default EBS encryption key").get("KmsKeyId", ""))
        except ProviderError as exc:
            add("ebs_key", None, f"The account's default EBS encryption key could not be read ({exc.reason}); allow "
                "ec2:GetEbsDefaultKmsKeyId (infra/aws/control-plane-policy.json). " + KMS_GRANTS)
            return
        if not key or key == "alias/aws/ebs" or key.endswith(":alias/aws/ebs"):
            add("ebs_key", True, "Disks are encrypted with the AWS managed EBS key (aws/ebs): no KMS grant needed.")
            return
        add("ebs_key", None, f"The account's default EBS encryption key is {key}, a customer-managed key. "
            + KMS_GRANTS)

    def _check_credentials(self, add: Callable[[str, bool | None, str], None]) -> str | None:
        try:
            ident = self.aws.call("sts", "get_caller_identity", action="checking the credentials")
        except ProviderError as exc:
            add("credentials", False, f"{exc.reason}")
            return None
        arn = str(ident.get("Arn", ""))
        account = str(ident.get("Account", ""))
        if arn.endswith(":root"):
            add("credentials", False, "These are root-account keys. Create a dedicated IAM user with the "
                "connector policy and paste that user's access key instead (guide, step 4).")
            return None
        add("credentials", True, f"Authenticated as {arn} in account {account}.")
        expires = self.config.session_expires_at
        if expires is not None and (expires if expires.tzinfo else expires.replace(tzinfo=UTC)) <= now():
            add("session_token", False, "The session credentials have expired; paste fresh ones, or better an "
                "IAM user's access key (Tensorant does not renew STS sessions).")
            return None
        for warning in self.config.warnings():
            add("session_token", None, warning)
        return account

    def _check_image(self, add: Callable[[str, bool | None, str], None]) -> dict[str, Any] | None:
        ami = self.config.ami_id
        try:
            image = catalog.image(self.aws, ami)
        except ProviderError as exc:
            msg = exc.reason if exc.code != "InvalidAMIID.NotFound" else \
                f"AMI {ami} was not found in {self.region}."
            add("image", False, f"{msg} Paste an AMI ID from {self.region} (AMI IDs differ per region).")
            return None
        add("image", True, f"AMI {ami} ({image.get('Name', '')}) exists in {self.region}.")
        state = image.get("State")
        add("image_available", state == "available",
            "The AMI is available." if state == "available" else
            f"The AMI is {state}, not available; wait until it is available or use another AMI.")
        arch = image.get("Architecture")
        add("image_architecture", arch == "x86_64",
            "The AMI is x86_64." if arch == "x86_64" else
            f"The AMI is {arch}; Tensorant needs an x86_64 image (ARM/Graviton is not supported).")
        root = image.get("RootDeviceType")
        add("image_root_device", root == "ebs",
            "The AMI has an EBS root disk." if root == "ebs" else
            f"The AMI's root device is {root}; create an EBS-backed AMI (guide, step 3).")
        details = image.get("PlatformDetails")
        linux = image.get("Platform") != "windows" and (details in (None, "", "Linux/UNIX"))
        add("image_platform", linux,
            "The AMI is Linux/UNIX." if linux else
            f"The AMI's platform is {details or image.get('Platform')}; use a Linux/UNIX AMI "
            "such as the Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu).")
        codes = [c.get("ProductCodeId", "") for c in image.get("ProductCodes") or []]
        add("image_marketplace", not codes,
            "The AMI carries no Marketplace product code." if not codes else
            f"The AMI carries Marketplace product code {', '.join(codes)}; Tensorant rejects Marketplace "
            "images. Use a plain AMI or build your own EBS-backed image.")
        if state != "available" or arch != "x86_64" or root != "ebs" or not linux or codes:
            return None
        return image

    def _check_network(self, add: Callable[[str, bool | None, str], None]) -> dict[str, Any] | None:
        subnet: dict[str, Any] | None = None
        try:
            subnet = catalog.subnet(self.aws, self.config.subnet_id)
            add("subnet", True, f"Subnet {self.config.subnet_id} is in {subnet['AvailabilityZone']} "
                f"(VPC {subnet['VpcId']}).")
        except ProviderError as exc:
            add("subnet", False, f"Subnet {self.config.subnet_id} was not found in {self.region} ({exc.code or exc.reason}). "
                "Paste the private subnet's subnet-… ID from this region.")
        try:
            groups = self.aws.call("ec2", "describe_security_groups", GroupIds=[self.config.security_group_id],
                               action="reading the security group").get("SecurityGroups") or []
        except ProviderError as exc:
            groups = []
            if exc.code not in ("InvalidGroup.NotFound", "InvalidGroupId.Malformed"):
                add("security_group", False, exc.reason)
                return subnet
        if not groups:
            add("security_group", False, f"Security group {self.config.security_group_id} was not found in "
                f"{self.region}; paste the sg-… ID of a group in the subnet's VPC.")
        elif subnet is not None and groups[0].get("VpcId") != subnet.get("VpcId"):
            add("security_group", False, f"Security group {self.config.security_group_id} is in VPC "
                f"{groups[0].get('VpcId')}, but the subnet is in VPC {subnet.get('VpcId')}; "
                "use a security group from the subnet's VPC.")
        else:
            add("security_group", True, f"Security group {self.config.security_group_id} is in the subnet's VPC.")
        return subnet

    def _check_zone(self, add: Callable[[str, bool | None, str], None], zone: str) -> list[catalog.GpuType]:
        try:
            types = catalog.gpu_types(self.aws, zone)
        except ProviderError as exc:
            add("zone_gpus", False, f"Could not list the GPU types of {zone}: {exc.reason}")
            return []
        if not types:
            add("zone_gpus", False, f"{zone} offers none of the supported single-GPU types (A10G, L4, L40S, "
                "A100, H100 class). Create the private subnet in an availability zone that offers one.")
        else:
            names = ", ".join(f"{t.instance_type} ({t.gpu})" for t in types[:6])
            more = f" and {len(types) - 6} more" if len(types) > 6 else ""
            add("zone_gpus", True, f"{zone} offers {names}{more}. A listing does not reserve capacity "
                "or raise your quota.")
        return types

    def _check_key_pair(self, add: Callable[[str, bool | None, str], None]) -> None:
        name = self.config.key_name
        try:
            found = self.aws.call("ec2", "describe_key_pairs", KeyNames=[name],
                              action="reading the key pair").get("KeyPairs") or []
        except ProviderError as exc:
            if isinstance(exc, AuthError) and exc.code in AUTH_CODES:
                add("key_pair", None, f"Could not check key pair {name!r}: the policy does not grant "
                    "ec2:DescribeKeyPairs. A wrong name will fail the launch.")
                return
            found = []
        add("key_pair", bool(found), f"Key pair {name!r} exists in {self.region}." if found else
            f"Key pair {name!r} was not found in {self.region}; enter the exact key-pair name from "
            "EC2 → Key pairs in this region, or leave it empty.")

    def _check_profile(self, add: Callable[[str, bool | None, str], None], account: str) -> None:
        arn = self.config.instance_profile_arn or ""
        profile_account = arn.split(":")[4]
        if profile_account != account:
            add("instance_profile", False, f"The instance profile belongs to account {profile_account}, "
                f"but the credentials are for account {account}; use a profile from the same account.")
            return
        try:
            profile = self.aws.call("iam", "get_instance_profile", InstanceProfileName=self.config.instance_profile_name,
                                action="reading the instance profile")["InstanceProfile"]
        except ProviderError as exc:
            if isinstance(exc, AuthError):
                add("instance_profile", None, "Could not check the instance profile: the policy does not "
                    "grant iam:GetInstanceProfile. A wrong ARN will fail the launch.")
            else:
                add("instance_profile", False, f"Instance profile {arn} was not found; paste the ARN shown on "
                    "the role's page as 'Instance profile ARN'.")
            return
        roles = [r.get("Arn", "") for r in profile.get("Roles") or []]
        if not roles:
            add("instance_profile", False, f"Instance profile {arn} contains no role; add the SSM role to it.")
            return
        add("instance_profile", True, f"Instance profile exists with role {roles[0]}. The control-plane "
            "policy also needs iam:PassRole for that role (guide, step 4).")
