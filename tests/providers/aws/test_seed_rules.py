"""AWS document rules implemented without a test (issue 41.16)."""

from __future__ import annotations

from shared.models import CheckStatus
from tests.providers.aws.rig import Rig


def test_a_zone_listing_says_it_reserves_no_capacity(rig: Rig) -> None:
    """'A regional listing does not reserve capacity or increase your quota.'"""
    checks = {c.name: c for c in rig.compute().validate()}
    zone = checks["zone_gpus"]
    assert zone.status == CheckStatus.ok and "does not reserve capacity or raise your quota" in zone.message
