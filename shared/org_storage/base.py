"""The storage backend Protocol (local directory, custom S3, RunPod network volume).

Layout inside the backend (under an optional prefix):
  datasets/<PROJECT_ID>/<DATASET_VERSION_ID>.jsonl           a dataset sent through the API
  datasets/<PROJECT_ID>/<DATASET_VERSION_ID>.<COMMIT>.jsonl  a direct upload, as its commit validated it
  uploads/<PROJECT_ID>/<DATASET_VERSION_ID>.jsonl            a direct upload before its commit (upload_key)
  runs/<RUN_ID>/adapter.zip      the verified adapter GET /api/runs/{id}/adapter serves
  runs/<RUN_ID>/merged.zip       training.merged: the adapter merged into the base model (?format=merged)
  runs/<RUN_ID>/logs.txt
  data/<RUN_ID>/...              RunPod network volume only: the pod's working directory (see scratch_key)
"""

from __future__ import annotations

from typing import BinaryIO, Protocol

from shared.models import Check


def dataset_key(project_id: str, dataset_id: str) -> str:
    return f"datasets/{project_id}/{dataset_id}.jsonl"


def adapter_key(run_id: str) -> str:
    return f"runs/{run_id}/adapter.zip"


def checkpoint_key(run_id: str, slot: int) -> str:
    """Slot `slot` of the run's ring of kept checkpoint adapters: a newer checkpoint overwrites the oldest
    slot, so storage never holds more than keep_checkpoints of them, with nothing to delete."""
    return f"runs/{run_id}/checkpoints/slot-{slot}.zip"


def merged_key(run_id: str) -> str:
    return f"runs/{run_id}/merged.zip"


def logs_key(run_id: str) -> str:
    return f"runs/{run_id}/logs.txt"


def scratch_key(run_id: str) -> str:
    """A RunPod pod's working directory on the org's network volume, relative to the volume root.

    The volume is mounted at /workspace, and a pod's agent data directory is /workspace/data/<RUN_ID>
    (each run apart: every pod of the org shares the volume). It holds the dataset copy, output/,
    adapter.zip, logs.txt and agent-state.json (which holds a run token), and outlives the pod. It is
    not where the verified adapter is served from (adapter_key). Kept while the run may be recovered;
    removed by the release step once the run ends succeeded or cancelled (shared/services/steps/working_files.py).
    """
    return f"data/{run_id}"


def upload_key(project_id: str, dataset_id: str) -> str:
    """Where a direct (presigned) dataset upload lands before its commit validates and copies it:
    never the dataset's own key, so the URL cannot change a dataset after it was validated. One
    dataset id (so one key) per upload URL; once the dataset is committed nothing reads this key
    again, so a PUT through the URL after the commit writes an object nobody uses."""
    return f"uploads/{project_id}/{dataset_id}.jsonl"


def committed_dataset_key(project_id: str, dataset_id: str, commit_id: str) -> str:
    """Where one commit of a direct upload writes the validated copy: a key of its own (commit_id is
    new per attempt), so a second or concurrent commit of the same dataset writes beside the
    committed object, never over it; the dataset record names the key of the commit that won."""
    return f"datasets/{project_id}/{dataset_id}.{commit_id}.jsonl"


STREAM_CHUNK = 1024 * 1024


class Readable(Protocol):
    """What put_stream reads from: a file, a request body in a BytesIO, a checking wrapper."""

    def read(self, n: int = -1, /) -> bytes: ...


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

    def put_stream(self, key: str, stream: Readable) -> int:
        """Write what `stream.read(n)` yields until b"", never holding it whole (bounded
        chunks); an exception from the stream leaves no object. Returns the bytes written."""
        ...

    def open_stream(self, key: str, max_bytes: int) -> BinaryIO:
        """A reader of the object: ObjectMissing when absent, ValueError when over max_bytes."""
        ...

    def open_range(self, key: str, start: int, max_bytes: int) -> tuple[BinaryIO, int]:
        """A reader of the object from byte `start` on, with the object's whole size (a download that
        carries on in a later invocation: shared/services/steps/verify_spool.py). ObjectMissing when absent,
        ValueError when over max_bytes; `start` at or past the end reads nothing."""
        ...

    def upload_url(self, key: str, ttl_s: int) -> str | None:
        """A presigned PUT URL for one object (direct uploads), or None when the backend has none."""
        ...

    def get(self, key: str, max_bytes: int) -> bytes:
        """Raise ObjectMissing when absent, ValueError when larger than max_bytes."""
        ...

    def delete(self, key: str) -> None: ...

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object whose key starts with prefix, a folder ending in "/" (anything else
        is a ValueError: "runs/r1" would also match "runs/r10"). Idempotent: nothing there = 0.
        Returns how many objects it deleted."""
        ...

    def download_url(self, key: str, ttl_s: int) -> str | None:
        """A short-lived GET URL for one object (a secret until it expires), or None when the
        backend has no URLs (local directory: the API streams the object instead)."""
        ...

    def agent_env(self, run_id: str, dataset: str, *, ttl_s: int | None = None,
                  merged: bool = False, checkpoints: int = 0,
                  validation: str = "") -> tuple[dict[str, str], frozenset[str]]:
        """Environment giving the agent short-lived, narrow access: download the dataset,
        upload runs/<RUN_ID>/adapter.zip and logs (and merged.zip when merged: training.merged; and the
        `checkpoints` slots of checkpoint_key as a JSON list; and the dataset key `validation` to download),
        valid for ttl_s (the run's whole life). Returns (env, keys that are secret)."""
        ...
