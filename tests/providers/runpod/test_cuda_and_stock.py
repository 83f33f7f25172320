"""What RunPod's API accepts (issue 27.4): pods and the catalog ask for a CUDA minimum
(`minCudaVersion`), not an exact list of versions; the catalog's stock is checked with or without a
network volume; and a request RunPod's schema refuses is a permanent error that says so.

The fake answers a field, argument or input field its schema (graphql_schema.py) does not define as
RunPod does: HTTP 400 with graphql-js's message."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from shared.errors import AuthError, CapacityError, PermanentError, ThrottledError
from shared.models import CheckStatus
from shared.providers.runpod import catalog
from shared.providers.runpod.client import RunPodApi
from shared.providers.runpod.compute import RunPodCompute
from shared.providers.runpod.config import RunPodConfig
from shared.providers.runpod.errors import translate
from shared.settings import Settings
from tests.providers.runpod import graphql_schema
from tests.providers.runpod.fake_server import FakeRunPod
from tests.providers.runpod.rig import KEY, provider, spec

# The catalog query before issue 27.4: lowestPrice's input named allowedCudaVersions, which
# GpuLowestPriceInput does not define (runpod-python and gpuhunt never send it there).
OLD_OFFERS = """query Offers($dc: String, $secure: Boolean, $cuda: [String]) {
  gpuTypes { id displayName memoryInGb secureCloud communityCloud securePrice communityPrice
    lowestPrice(input: {gpuCount: 1, dataCenterId: $dc, secureCloud: $secure, allowedCudaVersions: $cuda}) {
      uninterruptablePrice stockStatus } }
}"""


def _gpu(fake: FakeRunPod, gpu_id: str) -> dict[str, object]:
    return next(g for g in fake.gpus if g["id"] == gpu_id)


def _community() -> RunPodCompute:
    config = RunPodConfig(api_key=SecretStr(KEY), cloud_type="COMMUNITY")
    return RunPodCompute(config, Settings(deployment_id="test"))


# ---------------------------------------------------------------- the schema, strictly


def test_a_field_the_schema_does_not_define_is_a_permanent_schema_error(fake: FakeRunPod) -> None:
    """RunPod answers a request its schema refuses with HTTP 400 and the GraphQL errors; the client reads
    those errors (it read the 400 alone, as a raw body) and the error is permanent, sent once."""
    api = RunPodApi(KEY)
    with pytest.raises(PermanentError) as exc:
        api.query(OLD_OFFERS, {"dc": None, "secure": True, "cuda": ["13.0", "13.1"]})
    assert exc.value.code == "schema" and not isinstance(exc.value, (AuthError, CapacityError))
    assert 'Field "allowedCudaVersions" is not defined by type "GpuLowestPriceInput"' in exc.value.reason
    assert "retrying cannot" in exc.value.reason.lower()
    assert len(fake.requests) == 1


def test_a_400_whose_message_is_not_a_schema_error_stays_permanent(fake: FakeRunPod) -> None:
    """Reading a 400's GraphQL errors (the requests client: catalog, pod create, volumes) must not make it
    retryable: an unknown message is retryable on a 200 (RunPod's 'Something went wrong'), but RunPod
    refused this request itself."""
    fake.refuse_400 = "Invalid GPU type"
    with pytest.raises(PermanentError) as exc:
        provider().offers()
    assert exc.value.code == "http_400" and "Invalid GPU type" in exc.value.reason
    fake.refuse_400 = "Too many requests, slow down"
    with pytest.raises(ThrottledError):
        provider().offers()


@pytest.mark.parametrize(("query", "variables", "words"), [
    ('query { gpuTypes { id lowestPrice(input: {gpuCount: 1}, cudaMin: "13.0") { stockStatus } } }', {},
     'Unknown argument "cudaMin" on field "GpuType.lowestPrice"'),
    ("query { myself { id creditLimit } }", {}, 'Cannot query field "creditLimit" on type "User"'),
    ("mutation Create($input: PodFindAndDeployOnDemandInput!) { podFindAndDeployOnDemand(input: $input) { id } }",
     {"input": {"name": "n", "gpuCount": 1, "objectMounts": None}},
     'Variable "$input" got invalid value'),
    ("query Offers($dc: String) { gpuTypes { id } }", {}, 'Variable "$dc" is never used in operation "Offers"'),
])
def test_the_fake_refuses_as_graphql_does(fake: FakeRunPod, query: str, variables: dict[str, object],
                                          words: str) -> None:
    with pytest.raises(PermanentError) as exc:
        RunPodApi(KEY).query(query, variables)
    assert exc.value.code == "schema" and words in exc.value.reason, exc.value.reason


def test_every_request_tensorant_sends_passes_the_schema(fake: FakeRunPod) -> None:
    """The fake's strictness is no test of its own: what the provider sends through its life passes it."""
    p = provider()
    p.validate()
    p.offers()
    (pod,) = p.launch(spec())
    p.describe(spec().ref, [pod])
    p.retain(spec().ref, [pod])
    p.start(spec().ref, [pod])
    p.release(spec().ref, [pod])
    provider(network_volume_id="vol0abc123", datacenter_id="EU-RO-1").network_volumes()
    for request in fake.requests:
        _, errors = graphql_schema.validate(request["body"]["query"], request["body"].get("variables") or {})
        assert errors == [], (request["body"]["query"], errors)


@pytest.mark.parametrize("message", [
    'Cannot query field "clientBalance" on type "User".',
    'Field "creditLimit" is not defined by type "PodFindAndDeployOnDemandInput".',
    'Cannot query field "permissions" on type "ApiKey".',
    'Syntax Error: Unexpected Name "forbidden".',
])
def test_a_schema_error_is_not_read_as_funds_auth_or_not_found(message: str) -> None:
    """A schema message names a field or a token, which may hold 'credit', 'balance', 'permission' or
    'forbidden': it was read as a funds error ('add credit') or an auth error ('replace the key')."""
    got = translate(message)
    assert type(got) is PermanentError and got.code == "schema", (message, type(got), got.code)
    assert message in got.reason and "retrying cannot" in got.reason.lower()


def test_a_check_refused_by_the_schema_says_so_not_check_again_later(
        fake: FakeRunPod, monkeypatch: pytest.MonkeyPatch) -> None:
    """RunPod stops defining a field the account check reads: the connection check fails with the schema's
    words, not 'check again later' (no later check passes) nor 'add credit'."""
    monkeypatch.delitem(graphql_schema.OUTPUT["User"], "clientBalance")
    (check,) = provider().validate()
    assert check.status == CheckStatus.fail
    assert 'Cannot query field "clientBalance" on type "User"' in check.message
    assert "check again later" not in check.message and "Add credit" not in check.message


def test_a_launch_the_schema_refuses_is_permanent_and_sent_once(
        fake: FakeRunPod, monkeypatch: pytest.MonkeyPatch) -> None:
    """Were RunPod to stop defining minCudaVersion on pods, the launch fails at once with the schema's words
    (it was retried until the run's deadline)."""
    monkeypatch.delitem(graphql_schema.INPUT["PodFindAndDeployOnDemandInput"], "minCudaVersion")
    with pytest.raises(PermanentError) as exc:
        provider().launch(spec())
    assert exc.value.code == "schema" and "minCudaVersion" in exc.value.reason
    assert len(fake.creates()) == 1 and fake.pods == {}


# ---------------------------------------------------------------- the CUDA minimum


def test_the_catalog_asks_price_and_stock_for_the_cuda_minimum(fake: FakeRunPod) -> None:
    offers = provider().offers()
    assert {o.machine_type for o in offers} == {
        "NVIDIA A40", "NVIDIA GeForce RTX 4090", "NVIDIA H100 80GB HBM3", "NVIDIA L4"}
    assert fake.price_inputs == [{"gpuCount": 1, "secureCloud": True, "minCudaVersion": catalog.MIN_CUDA}]
    provider(network_volume_id="vol0abc123", datacenter_id="EUR-IS-1").offers()
    assert fake.price_inputs[-1] == {"gpuCount": 1, "secureCloud": True, "dataCenterId": "EUR-IS-1",
                                     "minCudaVersion": catalog.MIN_CUDA}
    assert not any(b"allowedCudaVersions" in r["raw"] for r in fake.requests)


def test_a_pod_is_placed_on_a_host_with_any_cuda_at_or_above_the_minimum(fake: FakeRunPod) -> None:
    """A host reporting CUDA 13.2 (or any version RunPod reports after this was written) takes the pod:
    the exact list (allowedCudaVersions 13.0, 13.1) turned it down as 'no instances available'."""
    _gpu(fake, "NVIDIA A40")["cuda"] = "13.2"
    (pod,) = provider().launch(spec())
    assert pod.kind == "pod" and len(fake.pods) == 1
    inp = fake.creates()[0]["variables"]["input"]
    assert inp["minCudaVersion"] == catalog.MIN_CUDA == "13.0" and "allowedCudaVersions" not in inp
    assert "NVIDIA A40" in {o.machine_type for o in provider().offers()}


def test_a_gpu_whose_hosts_are_below_the_minimum_is_neither_offered_nor_placed(fake: FakeRunPod) -> None:
    _gpu(fake, "NVIDIA A40")["cuda"] = "12.9"
    volume = provider(network_volume_id="vol0abc123", datacenter_id="EU-RO-1")
    assert "NVIDIA A40" not in {o.machine_type for o in volume.offers()}
    with pytest.raises(CapacityError):
        volume.launch(spec())
    assert fake.pods == {}


# ---------------------------------------------------------------- stock without a network volume


@pytest.mark.parametrize("make", [provider, _community], ids=["secure", "community"])
def test_without_a_network_volume_a_gpu_with_no_cuda_13_host_is_not_offered(fake: FakeRunPod, make) -> None:  # type: ignore[no-untyped-def]
    """Stock was read only for a volume's datacenter: without a volume a GPU with no host at CUDA 13 or
    above was offered, and every launch on it got 'no instances available'."""
    _gpu(fake, "NVIDIA A40")["cuda"] = "12.8"
    offered = {o.machine_type for o in make().offers()}
    assert "NVIDIA A40" not in offered and "NVIDIA GeForce RTX 4090" in offered
    with pytest.raises(CapacityError):
        make().launch(spec())
    assert fake.pods == {}


def test_a_gpu_without_stock_is_left_out_with_or_without_a_datacenter() -> None:
    """catalog.gpu_offers alone: lowestPrice without stock (RunPod's null stockStatus) is no offer."""
    gpu = {"id": "NVIDIA A40", "displayName": "A40", "memoryInGb": 48, "secureCloud": True, "securePrice": 0.4,
           "lowestPrice": {"uninterruptablePrice": None, "stockStatus": None}}
    for dc in (None, "EU-RO-1"):
        assert catalog.gpu_offers([gpu], cloud="SECURE", dc=dc, disk_gb=50) == [], dc
    stocked = {**gpu, "lowestPrice": {"uninterruptablePrice": 0.39, "stockStatus": "Low"}}
    (offer,) = catalog.gpu_offers([stocked], cloud="SECURE", dc=None, disk_gb=50)
    assert offer.compute_per_hour == 0.39 and offer.region == "any"


def test_preflight_reads_nothing(fake: FakeRunPod) -> None:
    """RunPod has no quota to read, and its stock is judged by the pod create itself (a CapacityError
    the run's failover handles), so preflight answers None without a request."""
    before = len(fake.requests)
    assert provider().preflight(spec().offer) is None
    assert len(fake.requests) == before
