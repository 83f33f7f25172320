"""RunPod document rules implemented without a test (issue 41.16)."""

from __future__ import annotations

from tests.providers.runpod.fake_server import FakeRunPod
from tests.providers.runpod.rig import REF, provider, spec


def test_releasing_says_the_network_volume_is_kept(fake: FakeRunPod) -> None:
    """'Your organization network volume remains after successful runs too; compute deletion does not delete
    shared storage.'"""
    p = provider(network_volume_id="vol0abc123", datacenter_id="EU-RO-1")
    res = p.launch(spec())
    out = p.release(REF, res)
    assert out.done and "network volume is kept" in out.billing_note and "never deletes shared storage" in out.detail
    assert any(v.get("id") == "vol0abc123" for v in fake.volumes)  # and it is not deleted


def test_a_retained_pod_says_where_the_adapter_is_and_what_a_restart_costs(fake: FakeRunPod) -> None:
    """'With custom S3, retrieve /workspace/data/adapter.zip from the Pod ... Restart a stopped Pod before accessing
    its local files; restarting resumes GPU billing and depends on capacity.'"""
    p = provider()
    res = p.launch(spec())
    note = p.retain(REF, res).billing_note
    assert "/workspace/data/adapter.zip" in note and "resumes GPU billing" in note and "capacity" in note
