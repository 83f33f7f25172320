"""Every third-party module the runpod provider imports, one lazy adaptor each (shared/providers/lazy.py):
nothing is imported until first used, a missing SDK says what to install, and ProviderInfo.sdk_modules
is derived from this list."""

from __future__ import annotations

from shared.providers.lazy import LazyImport

NEEDED_BY = "the runpod provider"
requests = LazyImport("requests", "requests", needed_by=NEEDED_BY)  # the GraphQL API itself
runpod_pod_mutations = LazyImport("runpod.api.mutations.pods", "runpod", needed_by=NEEDED_BY)
