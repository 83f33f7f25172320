"""Agent log lines in bounded chunks: one entity per chunk, whose `data` property (JSON, ASCII:
json.dumps escapes the rest) stays under the service's 32K UTF-16 characters per string property."""

from __future__ import annotations

import json

from shared.clock import now
from shared.store.tables import Table

LOG_CHUNK_CHARS = 28_000  # under the 32K limit, with room for the chunk's other fields
# A chunk's RowKey is the line number after its last line, zero-padded: `RowKey gt <cursor>`
# then finds the chunk that holds line <cursor> first, in key order.
_LINE_KEY = "{:010d}"


class Logs:
    def __init__(self, table: Table) -> None:
        self._table = table

    def add(self, run_id: str, start: int, lines: list[str]) -> int:
        """Store lines numbered start, start+1, ... in chunks (one entity each, every property
        under the table's limit); returns the number of chunks written (one write each)."""
        chunks = log_chunks(lines)
        first = start
        for chunk in chunks:
            end = first + len(chunk)
            data = {"start": first, "at": now().isoformat(), "lines": chunk}
            self._table.upsert(run_id, _LINE_KEY.format(end), data)
            first = end
        return len(chunks)

    def prune(self, run_id: str) -> int:
        """Delete the run's log chunks; returns how many."""
        return self._table.delete_partition(run_id)

    def read(self, run_id: str, after: int, limit: int) -> tuple[list[str], int]:
        """Up to `limit` stored lines numbered >= after, in order; returns (lines, the number
        of the line after the last one returned, or `after` when none was). Reads only the
        chunks it returns lines from (plus the rest of the page they came in)."""
        out: list[str] = []
        cursor = after
        q = self._table.pages("PartitionKey eq @r and RowKey gt @k", per_page=min(max(limit // 100, 4), 100),
                              r=run_id, k=_LINE_KEY.format(after))
        for data, _ in q:
            start, lines = int(data["start"]), list(data["lines"])
            skip = max(0, cursor - start)
            take = lines[skip:skip + limit - len(out)]
            out.extend(take)
            # A chunk lost between its run write and its own write leaves a gap in the numbers.
            cursor = start + skip + len(take)
            if len(out) >= limit:
                break
        return out, cursor


def log_chunks(lines: list[str], budget: int = LOG_CHUNK_CHARS) -> list[list[str]]:
    """Split lines into chunks whose JSON stays within budget characters (a line longer than
    the budget alone is cut to fit: callers cap lines far below it)."""
    chunks: list[list[str]] = []
    current: list[str] = []
    size = 2  # the list's brackets
    for line in lines:
        n = len(json.dumps(line)) + 1  # + the separating comma
        if n > budget - 2:
            line = line[: (budget - 16) // 12]  # 12 = the longest escape (a surrogate pair) of one character
            n = len(json.dumps(line)) + 1
        if current and size + n > budget:
            chunks.append(current)
            current, size = [], 2
        current.append(line)
        size += n
    if current:
        chunks.append(current)
    return chunks
