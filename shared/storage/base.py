"""The storage backend Protocol (local directory, custom S3, RunPod network volume).

Layout inside the backend (under an optional prefix):
  datasets/<PROJECT_ID>/<DATASET_VERSION_ID>.jsonl
  runs/<RUN_ID>/adapter.zip
  runs/<RUN_ID>/logs.txt
"""

from __future__ import annotations

from typing import Protocol

from shared.models import Check


def dataset_key(project_id: str, dataset_id: str) -> str:
    return f"datasets/{project_id}/{dataset_id}.jsonl"


def adapter_key(run_id: str) -> str:
    return f"runs/{run_id}/adapter.zip"


def logs_key(run_id: str) -> str:
    return f"runs/{run_id}/logs.txt"


class ObjectMissing(Exception):
    pass


class StorageBackend(Protocol):
    kind: str

    def location(self) -> str:
        """Where the data lives (endpoint + bucket + prefix, volume, directory); a
        change of location is refused once projects exist."""
        ...

    def validate(self) -> list[Check]:
        """Write, read and delete a probe object; one check per operation."""
        ...

    def put(self, key: str, data: bytes) -> None: ...

    def get(self, key: str, max_bytes: int) -> bytes:
        """Raise ObjectMissing when absent, ValueError when larger than max_bytes."""
        ...

    def delete(self, key: str) -> None: ...

    def download_url(self, key: str, ttl_s: int) -> str | None:
        """A short-lived GET URL for one object (a secret until it expires), or None when the
        backend has no URLs (local directory: the API streams the object instead)."""
        ...

    def agent_env(self, run_id: str, dataset: str, *,
                  ttl_s: int | None = None) -> tuple[dict[str, str], frozenset[str]]:
        """Environment giving the agent short-lived, narrow access: download the dataset,
        upload runs/<RUN_ID>/adapter.zip and logs, valid for ttl_s (the run's whole life).
        Returns (env, keys that are secret)."""
        ...
