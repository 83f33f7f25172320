"""The AWS adapter's own fixtures. The rig they build on (tests/providers/aws/rig.py) and its
moto_ec2_url, pricing_server and rig fixtures are shared with other folders: those fixtures are in
tests/conftest.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.providers.aws.rig import ALL_ACTIONS, Rig


@pytest.fixture(scope="session", autouse=True)
def _policy_covers_every_call() -> Iterator[None]:
    """At the end of the session, every AWS action any test made must be granted by infra/aws."""
    yield
    if not ALL_ACTIONS:
        return
    from tests.providers.aws.policy import not_granted

    missing = not_granted(ALL_ACTIONS)
    assert not missing, f"the adapter called actions the IAM policy template does not grant: {missing}"


@pytest.fixture
def injected(rig: Rig) -> list[Any]:
    """The rig's listener list: add inject(...) listeners with add_injection."""
    return rig.listeners
