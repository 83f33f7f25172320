"""The HTTP transport of the control plane's Azure Storage clients (tables and queues).

requests, by default, reads the environment again on every request (proxy variables, no_proxy,
netrc, CA bundle): a scan of os.environ that cost about 0.7 ms of CPU per table call measured
on the heartbeat path (every agent, every few seconds), where the whole call costs about 2 ms.
Where none of those settings is present (the usual case), one session that does not read them
serves every call; where a proxy is set, the default transport is kept, so proxies and no_proxy
work as before;
a CA bundle named by REQUESTS_CA_BUNDLE or CURL_CA_BUNDLE is read once, as requests would.
"""

from __future__ import annotations

import os
import urllib.request
from typing import Any

POOL_SIZE = 32  # connections kept per host: concurrent calls beyond requests' default 10 reconnect
# Bounded retries: the SDK's default (10 retries, exponential backoff) kept an HTTP request waiting
# about 5 s when the storage account was unreachable before it failed. Three quick retries ride out a
# blip; a longer outage is answered 503 with Retry-After (shared.http.respond) and a queue step is
# retried by the host after its visibility timeout.
RETRIES = {"retry_total": 3, "retry_backoff_factor": 0.2, "retry_backoff_max": 1,
           "connection_timeout": 3, "read_timeout": 20}


def storage_client_kwargs() -> dict[str, Any]:
    """Keyword arguments for a Storage client's from_connection_string: this transport (or the
    SDK's default) and bounded retries."""
    transport = storage_transport()
    return {**RETRIES, **({"transport": transport} if transport is not None else {})}


def storage_transport() -> Any:
    """A RequestsTransport for Storage clients, or None for the SDK's default."""
    if urllib.request.getproxies():
        return None
    import requests
    from azure.core.pipeline.transport import RequestsTransport

    session = requests.Session()
    session.trust_env = False
    session.verify = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or True
    adapter = requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=POOL_SIZE)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return RequestsTransport(session=session, session_owner=False)
