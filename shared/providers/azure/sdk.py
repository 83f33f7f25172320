"""Every third-party module the azure provider imports, one lazy adaptor each (shared/providers/lazy.py):
nothing is imported until first used, a missing SDK says what to install, and ProviderInfo.sdk_modules
is derived from this list. `azure` itself is a namespace package (azure-functions, azure-core and every
azure-mgmt-* share it): each adaptor names the module that holds the code."""

from __future__ import annotations

from shared.providers.lazy import LazyImport

NEEDED_BY = "the azure provider"
core_exceptions = LazyImport("azure.core.exceptions", "azure-core", needed_by=NEEDED_BY)
core_rest = LazyImport("azure.core.rest", "azure-core", needed_by=NEEDED_BY)  # plain ARM requests (backstop.py)
identity = LazyImport("azure.identity", "azure-identity", needed_by=NEEDED_BY)
mgmt_core_policies = LazyImport("azure.mgmt.core.policies", "azure-mgmt-core", needed_by=NEEDED_BY)  # client.py
mgmt_compute = LazyImport("azure.mgmt.compute", "azure-mgmt-compute", needed_by=NEEDED_BY)
mgmt_network = LazyImport("azure.mgmt.network", "azure-mgmt-network", needed_by=NEEDED_BY)
requests = LazyImport("requests", "requests", needed_by=NEEDED_BY)  # the Retail Prices API
