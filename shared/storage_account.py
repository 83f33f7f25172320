"""The app's own Storage clients (tables and queues): from the connection string in AzureWebJobsStorage, or,
where the deployment uses an identity-based connection as infra/controlplane/main.bicep does
(AzureWebJobsStorage__accountName, no key anywhere), from the same account with the app's managed identity.
The Functions host reads the same settings for its triggers, so the app and the host meet on one account."""

from __future__ import annotations

import os
from typing import Any

ACCOUNT_SETTING = "AzureWebJobsStorage__accountName"


def identity_endpoint(service: str) -> str | None:
    """The service's URL when the connection is identity-based (`table` or `queue`), else None. An explicit
    AzureWebJobsStorage__<service>ServiceUri wins, as it does for the host."""
    if os.environ.get("AzureWebJobsStorage"):
        return None
    explicit = os.environ.get(f"AzureWebJobsStorage__{service}ServiceUri")
    if explicit:
        return explicit
    account = os.environ.get(ACCOUNT_SETTING)
    return f"https://{account}.{service}.core.windows.net" if account else None


def service_client(client_class: Any, service: str, connection_string: str, **kwargs: Any) -> Any:
    """client_class (TableServiceClient, QueueServiceClient) for this deployment's account."""
    endpoint = identity_endpoint(service)
    if endpoint is None:
        return client_class.from_connection_string(connection_string, **kwargs)
    # Managed identity in Azure; a developer's `az login` elsewhere. Imported only on this path.
    from azure.identity import DefaultAzureCredential

    return client_class(endpoint, credential=DefaultAzureCredential(), **kwargs)
