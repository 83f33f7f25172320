"""What a RunPod pod's env input hands the agent (the inverse of shared.providers.bootstrap_env.pod_env)."""

from __future__ import annotations

from shared.providers.bootstrap_env import VAR, decode


def from_pod_env(entries: list[dict[str, str]]) -> dict[str, str]:
    found = {e["key"]: e["value"] for e in entries}
    if set(found) != {VAR}:
        raise ValueError(f"a pod env must hold only {VAR}, not {sorted(found)}")
    return decode(found[VAR])
