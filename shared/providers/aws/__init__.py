"""AWS EC2 compute provider. This module and `config` import no SDK; `compute` loads boto3 lazily."""

from __future__ import annotations

from pydantic import BaseModel

from shared.providers.aws import sdk
from shared.providers.aws.config import AwsConfig
from shared.providers.base import ComputeProvider
from shared.providers.lazy import modules_of
from shared.providers.registry import ProviderInfo
from shared.settings import Settings


def build(config: BaseModel, settings: Settings) -> ComputeProvider:
    from shared.providers.aws import compute  # the lifecycle module: only when a step needs AWS

    return compute.build(config, settings)


EXAMPLE = {"region": "us-east-1", "access_key_id": "AKIAIOSFODNN7EXAMPLE",
           "secret_access_key": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "ami_id": "ami-0123456789abcdef0",
           "subnet_id": "subnet-0123456789abcdef0", "security_group_id": "sg-0123456789abcdef0"}

PROVIDER = ProviderInfo("aws", AwsConfig, build, EXAMPLE, sdk_modules=modules_of(sdk),
                        resumes_training=True)
