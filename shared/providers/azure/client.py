"""The one door to the Azure SDK: credential and azure-mgmt clients, built lazily, with bounded waits.

Nothing else in shared.providers.azure imports azure.* (errors.translate imports
azure.core's exception types, lazily, to classify). Every call goes through AzureClient:
- timeouts: connection 20 s, read AzureEndpoints.read_timeout_s, long-running operations
  waited on at most AzureEndpoints.lro_wait_s (20 s) and never past the invocation's budget
  (shared/budget.py); the caller reports "not yet" after that and the step asks again later;
- 429: the SDK's own status retries are off (it would sleep out any Retry-After); `call`
  retries short ones inline (MAX_THROTTLE_RETRIES, Retry-After <= MAX_INLINE_RETRY_AFTER_S, and
  only while the invocation's budget has room for the sleep) and turns the others into
  ThrottledError(retry_after_s) so the step waits with a delayed message;
- errors leave as shared.errors through errors.translate.
Helpers for the plain-dict ARM bodies (dig, as_dict, region_code, same_id) live here too.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shared import budget
from shared.clock import now_ts
from shared.errors import RetryableError
from shared.log import register_secret
from shared.providers.azure import sdk
from shared.providers.azure.config import AzureConfig
from shared.providers.azure.errors import retry_after, status_code, translate
from shared.providers.azure.pricing import RETAIL_PRICES_URL, RetailPrices

ARM_SCOPE = "https://management.azure.com/.default"
MAX_THROTTLE_RETRIES = 2
MAX_INLINE_RETRY_AFTER_S = 10.0
MAX_BLOB_READ = 4 * 1024 * 1024  # read_tail's bound when a server answers a ranged GET with the whole blob
WAIT_SLICE_S = 5.0  # how often a wait looks at the clock (a poller's wait returns at once when done)
# The hosts a boot diagnostics SAS URI may name (host[:port], whole match): Azure Storage's blob endpoints,
# an account's (`<account>.blob.core.windows.net`) or managed storage's (`md-<id>[.z<n>].blob.storage.azure.net`).
# The URI comes from an ARM answer and the control plane fetches it: anything else could point the control
# plane's own network (169.254.169.254, loopback, an intranet host), so it is refused before any request.
BLOB_HOST = r"[a-z0-9][a-z0-9-]{1,62}(\.z[0-9]{1,3})?\.blob\.(core\.windows\.net|storage\.azure\.net)"


def wait_on_poller(poller: Any, seconds: float) -> None:
    """Block until the operation is done or `seconds` have passed (AzureEndpoints.pause)."""
    poller.wait(timeout=seconds)


@dataclass(frozen=True)
class AzureEndpoints:
    """Where the clients talk to and how long they wait. Defaults = public Azure.

    Tests point everything at a fake ARM server on loopback: arm_url/authority/prices_url
    at https://127.0.0.1:PORT, verify = the self-signed certificate's path, retry_total=0,
    polling_interval=0, and sleep/pause hooks that move their simulated clock. Production never
    sets any of these: they reach AzureCompute only as its keyword-only `endpoints` argument.
    """

    arm_url: str | None = None
    authority: str | None = None  # None = login.microsoftonline.com (public cloud only)
    prices_url: str = RETAIL_PRICES_URL
    verify: bool | str = True
    retry_total: int | None = 3  # connection errors; HTTP status retries are ours (see AzureClient.call)
    polling_interval: float | None = None
    read_timeout_s: float = 60.0  # no call may hang a step
    lro_wait_s: float = budget.LRO_WAIT_S  # one operation's longest wait, within the invocation's budget
    credential: Any = None  # a TokenCredential to use instead of ClientSecretCredential
    sleep: Callable[[float], None] = time.sleep  # an inline throttling retry's wait
    pause: Callable[[Any, float], None] = wait_on_poller  # a slice of a long-running operation's wait
    blob_host: str = BLOB_HOST  # what a boot diagnostics URI's host[:port] must be (tests: the fake's)


# ------------------------------------------------------------ ARM body helpers


def without_auto_registration(client: Any) -> Any:
    """The azure-mgmt client with its ARMAutoResourceProviderRegistrationPolicy taken out of the pipeline.

    On a 409 MissingSubscriptionRegistration that policy POSTs .../providers/<namespace>/register and then
    polls it with time.sleep(10): with a role broader than the documents' it would register silently
    (registering is an administrator's task, the Azure guide says) and a step would sleep. The generated
    clients take no flag for it (only a whole `policies=` list built from their private config), so it is
    unlinked from the built pipeline; errors.translate keeps the hint for the administrator."""
    from shared.providers.azure import sdk

    registration_policy = sdk.mgmt_core_policies.ARMAutoResourceProviderRegistrationPolicy
    pipeline = client._client._pipeline
    chain = pipeline._impl_policies
    for i, policy in enumerate(chain):
        if isinstance(policy, registration_policy):
            if i > 0:
                chain[i - 1].next = policy.next
            del chain[i]
            break
    else:
        raise RuntimeError("azure-mgmt-core's pipeline changed: ARMAutoResourceProviderRegistrationPolicy not found")
    return client


def dig(d: Any, *path: str, default: Any = None) -> Any:
    """d[path[0]][path[1]]..., or default where a level is missing or not a dict."""
    for key in path:
        if not isinstance(d, dict) or key not in d:
            return default
        d = d[key]
    return d


def same_id(a: str | None, b: str | None) -> bool:
    """ARM IDs compare case-insensitively, ignoring a trailing slash; empty never matches."""
    return bool(a) and bool(b) and str(a).rstrip("/").lower() == str(b).rstrip("/").lower()


def region_code(name: str) -> str:
    """'East US' or 'eastus' -> 'eastus' (ARM answers either form depending on the API)."""
    return name.lower().replace(" ", "")


def as_dict(obj: Any) -> dict[str, Any]:
    """An SDK model (or None, or a dict already) as the ARM JSON-shaped dict."""
    if obj is None:
        return {}
    if isinstance(obj, dict):
        return obj
    out: dict[str, Any] = obj.as_dict()
    return out


# ------------------------------------------------------------ the client


class AzureClient:
    """One connection's SDK clients and the call discipline around them."""

    def __init__(self, config: AzureConfig, endpoints: AzureEndpoints) -> None:
        self.config = config
        self.endpoints = endpoints
        register_secret(config.client_secret.get_secret_value())
        self._cred: Any = None
        self._compute_clients: dict[str, Any] = {}
        self._network: Any = None

    def credential(self) -> Any:
        if self._cred is None:
            if self.endpoints.credential is not None:
                self._cred = self.endpoints.credential
            else:
                ClientSecretCredential = sdk.identity.ClientSecretCredential

                kw: dict[str, Any] = {}
                if self.endpoints.authority:
                    kw.update(authority=self.endpoints.authority, disable_instance_discovery=True)
                if self.endpoints.verify is not True:
                    kw["connection_verify"] = self.endpoints.verify
                if self.endpoints.retry_total is not None:
                    kw["retry_total"] = self.endpoints.retry_total
                self._cred = ClientSecretCredential(
                    self.config.tenant_id, self.config.client_id, self.config.client_secret.get_secret_value(), **kw)
        return self._cred

    def sign_in_error(self) -> str | None:
        """Ask Microsoft Entra ID for an ARM token: None when it is granted, else the refusal's text
        (it carries the AADSTS code that says what is wrong). Other failures propagate."""
        ClientAuthenticationError = sdk.core_exceptions.ClientAuthenticationError

        try:
            self.credential().get_token(ARM_SCOPE)
        except ClientAuthenticationError as e:
            return str(e)
        return None

    def _client_kwargs(self) -> dict[str, Any]:
        # retry_status=0: the SDK would sleep out every Retry-After of a 429 (unbounded); call() retries
        # short ones and turns long ones into ThrottledError so the step waits with a delayed message.
        kw: dict[str, Any] = {"retry_status": 0, "connection_timeout": 20, "read_timeout": self.endpoints.read_timeout_s}
        if self.endpoints.arm_url:
            kw["base_url"] = self.endpoints.arm_url
            kw["credential_scopes"] = [ARM_SCOPE]
        if self.endpoints.verify is not True:
            kw["connection_verify"] = self.endpoints.verify
        if self.endpoints.retry_total is not None:
            kw["retry_total"] = self.endpoints.retry_total
        if self.endpoints.polling_interval is not None:
            kw["polling_interval"] = self.endpoints.polling_interval
        return kw

    def compute(self, subscription_id: str | None = None) -> Any:
        """ComputeManagementClient for the connection's subscription (or another one: a gallery's)."""
        sub = (subscription_id or self.config.subscription_id).lower()
        if sub not in self._compute_clients:
            ComputeManagementClient = sdk.mgmt_compute.ComputeManagementClient

            self._compute_clients[sub] = without_auto_registration(
                ComputeManagementClient(self.credential(), sub, **self._client_kwargs()))
        return self._compute_clients[sub]

    def network(self) -> Any:
        if self._network is None:
            NetworkManagementClient = sdk.mgmt_network.NetworkManagementClient

            self._network = without_auto_registration(
                NetworkManagementClient(self.credential(), self.config.subscription_id, **self._client_kwargs()))
        return self._network

    def prices(self) -> RetailPrices:
        """The Retail Prices API client at this connection's endpoint (public, no credentials)."""
        return RetailPrices(self.endpoints.prices_url, verify=self.endpoints.verify)

    # ------------------------------------------------------------ calls

    def call(self, doing: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """One Azure call: short 429s retried inline (bounded, and only within the invocation's
        budget), everything else translated."""
        AzureError = sdk.core_exceptions.AzureError

        for attempt in range(MAX_THROTTLE_RETRIES + 1):
            try:
                return fn(*args, **kwargs)
            except AzureError as e:
                wait = retry_after(e, default=1.0)
                if (status_code(e) == 429 and attempt < MAX_THROTTLE_RETRIES and wait <= MAX_INLINE_RETRY_AFTER_S
                        and budget.allows(wait)):
                    self.endpoints.sleep(wait)
                    continue
                raise translate(e, doing) from None
        raise AssertionError("unreachable")

    def get(self, doing: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        """A GET where 404 means "not there" (None); otherwise as call()."""
        AzureError = sdk.core_exceptions.AzureError

        def get() -> Any:
            try:
                return fn(*args, **kwargs)
            except AzureError as e:
                if status_code(e) == 404:
                    return None
                raise

        found = self.call(doing, get)
        return as_dict(found) if found is not None else None

    def call_once(self, doing: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any | None:
        """One request without inline retries, for callers that answer "not yet" themselves
        (release turns a refusal into CloudProgress(done=False)). 404 = None; other errors translated."""
        AzureError = sdk.core_exceptions.AzureError

        try:
            return fn(*args, **kwargs)
        except AzureError as e:
            if status_code(e) == 404:
                return None
            raise translate(e, doing) from None

    def read_tail(self, url: str, max_bytes: int, timeout_s: float) -> str:
        """The last max_bytes of the blob at a SAS URL (a boot diagnostics serial log), decoded as
        UTF-8: HEAD for its size, then one ranged GET (read in chunks, keeping only the tail, should a
        server ignore the range). The URL grants read access: it is registered as a secret and never
        appears in an error. Errors are RetryableError. Only an https URL of a storage host (BLOB_HOST) is
        read, and no redirect is followed (a 3xx is an error), so an answer cannot send the read elsewhere."""
        requests = sdk.requests

        register_secret(url)
        self._check_blob_url(url)
        verify = self.endpoints.verify
        try:
            head = requests.head(url, timeout=timeout_s, verify=verify, allow_redirects=False)
            if head.status_code != 200:
                raise RetryableError(f"the serial console log answered HTTP {head.status_code}", code="BlobRead")
            size = int(head.headers.get("Content-Length") or 0)
            if size == 0:
                return ""
            start = max(0, size - max_bytes)
            with requests.get(url, headers={"Range": f"bytes={start}-{size - 1}"}, timeout=timeout_s, verify=verify,
                              stream=True, allow_redirects=False) as resp:
                if resp.status_code not in (200, 206):
                    raise RetryableError(f"the serial console log answered HTTP {resp.status_code}", code="BlobRead")
                tail, seen = b"", 0
                for chunk in resp.iter_content(64 * 1024):
                    tail, seen = (tail + chunk)[-max_bytes:], seen + len(chunk)
                    if seen >= MAX_BLOB_READ:
                        break
        except requests.RequestException as exc:
            raise RetryableError(f"cannot read the serial console log ({type(exc).__name__})",
                                 code="BlobRead") from None
        return tail.decode("utf-8", "replace")

    def _check_blob_url(self, url: str) -> None:
        from urllib.parse import urlsplit

        try:
            parts = urlsplit(url)
            ok = (parts.scheme == "https" and re.fullmatch(self.endpoints.blob_host, parts.netloc) is not None
                  and "@" not in parts.netloc)
        except ValueError:  # an invalid port or IPv6 literal
            ok = False
        if not ok:
            # The URI is a secret (its SAS) and the host is what was refused: neither is echoed.
            raise RetryableError("the serial console log's URI is not an https Azure Storage blob URI; it was not "
                                 "read", code="BlobRead")

    def wait(self, doing: str, poller: Any, *, until: float | None = None) -> bool:
        """Wait for a long-running operation at most lro_wait_s, and never past the invocation's budget
        (shared/budget.py) or `until` (a shared.clock timestamp: several operations waited on together).
        True = finished (raises if it failed); False = not yet, Azure goes on with it and the caller
        reports "not done yet"."""
        AzureError = sdk.core_exceptions.AzureError

        end = now_ts() + budget.remaining(self.endpoints.lro_wait_s)
        if until is not None:
            end = min(end, until)
        try:
            while not poller.done():
                left = end - now_ts()
                if left <= 0:
                    return False
                self.endpoints.pause(poller, min(WAIT_SLICE_S, left))  # re-raises the operation's failure
            poller.result()
        except AzureError as e:
            raise translate(e, doing) from None
        return True

    def wait_until(self) -> float:
        """The end of a wait starting now (lro_wait_s, within the budget): for operations waited on together."""
        return now_ts() + budget.remaining(self.endpoints.lro_wait_s)
