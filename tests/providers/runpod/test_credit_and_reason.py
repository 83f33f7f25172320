"""On the fake RunPod server: the account as a run's scope, the pod's own status in
describe, and prepaid credit: shown at save, checked at launch, warned about while low."""

from __future__ import annotations

import pytest

from shared.errors import PermanentError
from shared.models import CheckStatus
from shared.providers.base import console_of, scope_of
from tests.providers.runpod.fake_server import FakeRunPod
from tests.providers.runpod.rig import REF, provider, spec


def test_scope_is_the_account_not_the_key(fake: FakeRunPod) -> None:
    assert scope_of(provider()) == {"account": "user_fake"}
    assert "rpa_" not in str(scope_of(provider()))


def test_describe_reason_has_desired_status_and_last_change(fake: FakeRunPod) -> None:
    pod_id = fake.add_pod(REF.name, status="CREATED")
    fake.pods[pod_id]["lastStatusChange"] = "Rented by User: Mon Dec 01 2026 10:00:00 GMT"
    reason = provider().describe(REF, []).reason
    assert f"RunPod pod {pod_id} desiredStatus CREATED" in reason
    assert "last status change: Rented by User: Mon Dec 01 2026 10:00:00 GMT" in reason
    assert "no container running" in reason


def test_describe_reason_is_scrubbed_and_bounded_and_there_is_no_console(fake: FakeRunPod) -> None:
    pod_id = fake.add_pod(REF.name, status="RUNNING")
    fake.pods[pod_id]["lastStatusChange"] = "Error: pull https://r.example/v2/x?X-Amz-Signature=abc123 " + "y" * 3000
    reason = provider().describe(REF, []).reason
    assert f"RunPod pod {pod_id} desiredStatus RUNNING" in reason and "container up 1 s" in reason
    assert "abc123" not in reason and len(reason) <= 1500
    assert console_of(provider(), REF, []) == ""  # RunPod keeps no console the API can read


def test_balance_check_at_save(fake: FakeRunPod) -> None:
    fake.balance = 42.5
    check = {c.name: c for c in provider().validate()}["balance"]
    assert check.status == CheckStatus.ok and "$42.50" in check.message
    fake.balance = 3.0
    check = {c.name: c for c in provider().validate()}["balance"]
    assert check.status == CheckStatus.warn and "$3.00" in check.message and "Billing" in check.message


def test_launch_refused_when_credit_cannot_cover_price_limit_times_runtime(fake: FakeRunPod) -> None:
    fake.balance = 5.0
    base = spec()
    too_long = type(base)(ref=base.ref, offer=base.offer, bootstrap=base.bootstrap, price_limit_per_hour=1.5,
                          runtime_limit_s=4 * 3600)
    with pytest.raises(PermanentError) as err:
        provider().launch(too_long)
    assert err.value.code == "credit"
    assert "$5.00" in err.value.reason and "$1.50/h x runtime limit 4.00 h = $6.00" in err.value.reason
    assert fake.creates() == []  # nothing was rented
    fits = type(base)(ref=base.ref, offer=base.offer, bootstrap=base.bootstrap, price_limit_per_hour=1.5,
                      runtime_limit_s=3 * 3600)
    assert [r.kind for r in provider().launch(fits)] == ["pod"]


def test_credit_warning_only_when_low(fake: FakeRunPod) -> None:
    fake.balance = 50.0
    assert provider().credit_warning() == ""
    fake.balance = 2.25
    assert "$2.25" in provider().credit_warning()
    fake.balance = None
    assert provider().credit_warning() == ""
