"""preflight(): one more VM of the offer's size against the region's compute usages (the VM family's
vCPUs and the Total Regional vCPUs), read with the real azure-mgmt-compute client from the fake ARM
server's usages route (Usage - List, shaped as the API: name.value / name.localizedValue, currentValue,
limit, unit). The rig's usages: cores 10 of 100, A10 family 0 of 36, A100 family 0 of 24, H100 family
0 of 0."""

from __future__ import annotations

from typing import Any

from tests.providers.azure.fake_arm import FakeArm
from tests.providers.azure.rig import REF, offer, spec, writes


def _usage(fake: FakeArm, name: str) -> dict[str, Any]:
    return next(u for u in fake.usages if u["name"]["value"] == name)


def _usage_reads(fake: FakeArm) -> int:
    return sum(1 for m, p, _, _ in fake.requests if m == "GET" and p.lower().endswith("/usages"))


def test_a_family_without_quota_is_refused_with_the_figures(fake: FakeArm, compute: Any) -> None:
    _usage(fake, "standardNCadsH100v5Family")["name"]["localizedValue"] = "Standard NCADSH100v5 Family vCPUs"
    why = compute.preflight(offer("Standard_NC40ads_H100_v5"))
    assert why is not None
    assert why.startswith("Standard NCADSH100v5 Family vCPUs: 0 of 0 free in eastus")
    assert "Standard_NC40ads_H100_v5 needs 40" in why and "Usage + quotas" in why
    assert compute.preflight(offer("Standard_NC24ads_A100_v4")) is None  # 24 of 24 free, 90 regional
    assert _usage_reads(fake) and writes(fake) == []  # reads only


def test_the_family_is_matched_whatever_its_case_and_in_use_counts(fake: FakeArm, compute: Any) -> None:
    a100 = _usage(fake, "StandardNCADSA100v4Family")
    a100["name"]["value"] = "standardNCADSA100v4Family"  # Azure's casing varies between APIs
    a100["currentValue"] = 1
    why = compute.preflight(offer("Standard_NC24ads_A100_v4"))
    assert why is not None and "23 of 24 free in eastus" in why and "needs 24" in why


def test_the_regional_vcpus_bound_it_too(fake: FakeArm, compute: Any) -> None:
    _usage(fake, "cores")["currentValue"] = 90  # 10 regional vCPUs left, the family has 24
    why = compute.preflight(offer("Standard_NC24ads_A100_v4"))
    assert why is not None and why.startswith("Total Regional vCPUs: 10 of 100 free in eastus")


def test_the_runs_own_vm_is_never_a_reason(fake: FakeArm, compute: Any) -> None:
    compute.launch(spec())
    fake.finish_ops()
    _usage(fake, "StandardNCADSA100v4Family")["currentValue"] = 24  # the run's own VM took the family's quota
    assert compute.preflight(offer("Standard_NC24ads_A100_v4")) is not None  # for another run: full
    assert compute.preflight(offer("Standard_NC24ads_A100_v4"), REF) is None


def test_nothing_known_is_none(fake: FakeArm, compute: Any) -> None:
    fake.usages = [u for u in fake.usages if u["name"]["value"] != "StandardNCADSA100v4Family"]
    assert compute.preflight(offer("Standard_NC24ads_A100_v4")) is None  # the family is not listed
    fake.fail("GET", r"/usages$", 403, "AuthorizationFailed", message="no Microsoft.Compute/locations/usages/read")
    assert compute.preflight(offer("Standard_NV36ads_A10_v5")) is None  # a read that fails knows nothing
    assert compute.preflight(offer("Standard_NC4as_T4_v3")) is None  # not a supported size: launch refuses it
