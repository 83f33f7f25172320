"""The documented egress lists name the control-plane URL: the VM must reach it for heartbeats."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("cloud", ["aws", "azure"])
def test_infra_egress_list_names_the_control_plane_url(cloud: str) -> None:
    text = (ROOT / "infra" / cloud / "README.md").read_text()
    section = text.split("## Outbound network (egress)", 1)[1].split("\n## ", 1)[0]
    assert "TENSORANT_PUBLIC_URL" in section and "heartbeats" in section
