"""A run's cloud resources, as recorded on the run, in the ledger and by the provider."""

from __future__ import annotations

from shared.models import CloudResource


def merge_resources(existing: list[CloudResource], new: list[CloudResource]) -> list[CloudResource]:
    """One entry per (kind, id); a resource in `new` replaces the same one in `existing`."""
    by_key = {(r.kind, r.id): r for r in existing}
    by_key.update({(r.kind, r.id): r for r in new})
    return list(by_key.values())


# Resource kinds that are the machine itself (stopped on retain); the others are its disk,
# volume, NIC or work directory (kept on retain).
MACHINE_KINDS = frozenset({"instance", "vm", "pod", "process"})
