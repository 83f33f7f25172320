"""Every third-party module the aws provider imports, one lazy adaptor each (shared/providers/lazy.py):
nothing is imported until first used, a missing SDK says what to install, and ProviderInfo.sdk_modules
is derived from this list."""

from __future__ import annotations

from shared.providers.lazy import LazyImport

NEEDED_BY = "the aws provider"
boto3 = LazyImport("boto3", "boto3", needed_by=NEEDED_BY)
botocore_config = LazyImport("botocore.config", "botocore", needed_by=NEEDED_BY)
