"""The one door to RunPod's GraphQL API (and the runpod package, imported lazily); every
answer is translated by errors.py at this boundary.

Two paths, both to `$RUNPOD_API_BASE_URL/graphql` (read on every call, default
https://api.runpod.io) with the API key as a bearer token:

- `sdk(query)`: a query text as given (the `runpod` package formats the stop, resume and terminate
  mutations, values into GraphQL without escaping), so it is used only for fixed queries and for
  queries whose one parameter is a pod id we checked against POD_ID: account, pod list, pod get,
  stop, resume, terminate. It posts through query(), which reads every HTTP status.
- `query(query, variables)`: a small requests client that posts {query, variables}.
  Used wherever a value could carry user text (pod create with name, image and
  environment; GPU prices for a datacenter; network volumes), so no value can change
  the request.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from shared.errors import PermanentError, RetryableError, ThrottledError
from shared.log import register_secret
from shared.providers.runpod import sdk
from shared.providers.runpod.errors import from_status, translate

DEFAULT_BASE_URL = "https://api.runpod.io"
POD_ID = re.compile(r"^[a-z0-9]{6,40}$")
TIMEOUT_S = 30.0

def base_url() -> str:
    return os.environ.get("RUNPOD_API_BASE_URL", DEFAULT_BASE_URL).rstrip("/")


def check_pod_id(pod_id: str) -> str:
    """Pod ids go into the runpod package's formatted GraphQL: only plain ids pass."""
    if not POD_ID.match(pod_id or ""):
        raise PermanentError(f"{pod_id!r} is not a RunPod pod id", code="bad_pod_id")
    return pod_id


class RunPodApi:
    def __init__(self, api_key: str) -> None:
        self._key = api_key
        register_secret(api_key)

    def query(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        """POST {query, variables}; returns `data`. Values travel only as variables."""
        requests = sdk.requests

        try:
            resp = requests.post(
                f"{base_url()}/graphql",
                data=json.dumps({"query": query, "variables": variables or {}}),
                headers={"Content-Type": "application/json", "Authorization": f"Bearer {self._key}"},
                timeout=TIMEOUT_S,
            )
        except requests.RequestException as exc:
            raise RetryableError(f"cannot reach the RunPod API: {type(exc).__name__}", code="network") from exc
        if resp.status_code == 400:
            # RunPod answers a request its schema refuses with 400 and the GraphQL errors: read them, so
            # the error says which field (errors.translate), not a raw body.
            _errors_of(resp)
        err = from_status(resp.status_code, resp.text)
        if err:
            raise err
        return _data(_json(resp))

    def sdk(self, query: str) -> dict[str, Any]:
        """Run a fixed (or pod-id-only) query; returns `data`. Sent by query(), not the runpod package's
        run_graphql_query: that reads only a 401 from the status and returns any other refusal's body
        (a 403, a 429) as if it were an answer, so a throttled or forbidden call read as "no data" and was
        retried as a generic error (the provider contract's error table caught it)."""
        return self.query(query)


def _json(resp: Any) -> dict[str, Any]:
    try:
        body = resp.json()
    except ValueError as exc:
        raise RetryableError("RunPod API answered with something that is not JSON", code="bad_json") from exc
    if not isinstance(body, dict):
        raise RetryableError("RunPod API answered with an unexpected body", code="bad_json")
    return body


def _errors_of(resp: Any) -> None:
    """Raise the GraphQL errors a 400 carries, if it carries any. A message errors.translate does not
    know stays permanent here: RunPod refused the request itself, and the same request is refused again."""
    try:
        body = resp.json()
    except ValueError:
        return
    if not isinstance(body, dict) or not body.get("errors"):
        return
    try:
        _data(body)
    except ThrottledError:
        raise
    except RetryableError as exc:
        raise PermanentError(f"RunPod API refused the request (HTTP 400): {exc.reason.removeprefix('RunPod: ')}",
                             code="http_400") from exc


def _data(body: dict[str, Any]) -> dict[str, Any]:
    errors = body.get("errors")
    if errors:
        first = errors[0] if isinstance(errors, list) and errors else {}
        raise translate(str(first.get("message", "unknown error")) if isinstance(first, dict) else str(first))
    data = body.get("data")
    if not isinstance(data, dict):
        raise RetryableError("RunPod API answered without data", code="no_data")
    return data


# ---------------------------------------------------------------- the queries Tensorant sends

POD_FIELDS = "id name desiredStatus lastStatusChange imageName costPerHr gpuCount volumeInGb containerDiskInGb"

LIST_PODS = "query Pods { myself { pods { " + POD_FIELDS + " runtime { uptimeInSeconds } } } }"
ACCOUNT = "query Account { myself { id clientBalance } }"


def account(api: RunPodApi) -> dict[str, Any]:
    """The account's id and its prepaid credit (clientBalance, USD)."""
    return api.sdk(ACCOUNT).get("myself") or {}


def balance_of(acct: dict[str, Any]) -> float | None:
    value = acct.get("clientBalance")
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None
CREATE = (
    "mutation Create($input: PodFindAndDeployOnDemandInput!) { podFindAndDeployOnDemand(input: $input) { "
    + POD_FIELDS + " } }"
)
# lowestPrice's input travels whole as one variable of its own type, as gpuhunt sends it (offers_input):
# no field's scalar type is restated here.
OFFERS = """query Offers($price: GpuLowestPriceInput) {
  gpuTypes { id displayName memoryInGb secureCloud communityCloud securePrice communityPrice
    lowestPrice(input: $price) { uninterruptablePrice stockStatus } }
}"""
VOLUMES = "query Volumes { myself { networkVolumes { id name size dataCenterId } } }"


def offers_input(*, dc: str | None, secure: bool | None, min_cuda: str) -> dict[str, Any]:
    """OFFERS' variables: price and stock of one GPU on the hosts a pod of the run could be placed on
    (the pod create's cloud type, datacenter and CUDA minimum). The fields are GpuLowestPriceInput's as
    gpuhunt sends them (gpuCount, secureCloud, dataCenterId, minCudaVersion, ...); allowedCudaVersions
    is the pod create's, not lowestPrice's."""
    price: dict[str, Any] = {"gpuCount": 1}
    if secure is not None:  # ALL: both clouds
        price["secureCloud"] = secure
    if dc:
        price["dataCenterId"] = dc
    price["minCudaVersion"] = min_cuda
    return {"price": price}


def get_pod_query(pod_id: str) -> str:
    pod_id = check_pod_id(pod_id)  # the only value in this query text, checked to be a plain id
    return 'query Pod { pod(input: {podId: "' + pod_id + '"}) { ' + POD_FIELDS + " runtime { uptimeInSeconds } } }"


def list_pods(api: RunPodApi) -> list[dict[str, Any]]:
    """Every pod of the account that has a plain pod id (RunPod answers them all at once)."""
    pods = (api.sdk(LIST_PODS).get("myself") or {}).get("pods") or []
    return [p for p in pods if isinstance(p, dict) and POD_ID.match(str(p.get("id") or ""))]


# The runpod package formats these mutations (pod ids only, checked first).


def stop_mutation(pod_id: str) -> str:
    generate_pod_stop_mutation = sdk.runpod_pod_mutations.generate_pod_stop_mutation

    return str(generate_pod_stop_mutation(check_pod_id(pod_id)))


def resume_mutation(pod_id: str) -> str:
    generate_pod_resume_mutation = sdk.runpod_pod_mutations.generate_pod_resume_mutation

    return str(generate_pod_resume_mutation(check_pod_id(pod_id), 1))


def terminate_mutation(pod_id: str) -> str:
    generate_pod_terminate_mutation = sdk.runpod_pod_mutations.generate_pod_terminate_mutation

    return str(generate_pod_terminate_mutation(check_pod_id(pod_id)))
