"""Micro-batches without compute on padding (the `batching` training setting).

  padded   each micro-batch is batch_size random examples, right-padded to the longest: the
           first trainer's behaviour; on a chat set of 20-250-token answers about 40 % of the
           compute went to padding.
  grouped  the same examples per epoch, but each chunk of GROUP_CHUNK shuffled examples is sorted
           by length and cut into micro-batches, and the micro-batch order is shuffled again:
           rows of a batch have similar lengths, so little padding is left (~5 % measured).
  packed   each micro-batch of batch_size random examples is laid out end to end in as few rows
           as fit, each no longer than its longest example (first fit, longest first), with position ids
           restarting at 0 at each example and no attention mask: transformers (>= 4.44, and 5)
           then keeps attention within each example (a block-diagonal causal mask for sdpa and
           eager, varlen kernels for flash attention), so each example is computed as if alone.
           The only padding is the tail of the shorter rows, itself a separate "example" that
           nothing attends to and nothing learns from.

Every mode gives the same examples per micro-batch count (batch_size), so steps, epochs and the
token-weighted loss mean the same thing whichever is chosen. Streams are deterministic with the seed.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from shared.trainer.data import IGNORE, Tokenized

BATCHING = ("auto", "padded", "grouped", "packed")
GROUP_CHUNK = 64  # examples sorted together: large enough to find similar lengths, small enough to stay random
# Decoder architectures whose transformers attention honours packed position ids (masking_utils'
# packed-sequence detection); others are trained `grouped`.
PACKABLE = frozenset({"llama", "mistral", "qwen2", "qwen3"})


def choose_batching(setting: str, model_type: str, attention: str | None) -> str:
    """The batching mode to use (setting: the `batching` training setting; attention: the model's
    config._attn_implementation).

    auto: grouped, except packed under flash attention (varlen kernels: no padding and no mask at
    all). Measured on the CPU (sdpa, tiny Llama, batch 8, examples of 20-400 tokens, best of 3):
    padded 4,772 real tokens/s, grouped 6,047, packed 5,925 (15 % padding left in its rows, and
    sdpa then takes a block-diagonal mask). Packing on a GPU with sdpa is not measured here yet."""
    if setting == "packed" and model_type not in PACKABLE:
        return "grouped"  # packing would silently let examples attend to each other
    if setting != "auto":
        return setting
    return "packed" if model_type in PACKABLE and attention == "flash_attention_2" else "grouped"


def batch_stream(examples: list[Tokenized], batch_size: int, seed: int, *, grouped: bool) -> Iterator[
        tuple[int, list[Tokenized]]]:
    """Endless seeded stream of (epoch, micro-batch): each epoch is a fresh permutation, so epochs
    may be fractional. grouped: similar lengths together (see the module docstring)."""
    rng = random.Random(seed + 1)
    epoch = 0
    while True:
        order = list(range(len(examples)))
        rng.shuffle(order)
        if not grouped:
            batches = [order[i: i + batch_size] for i in range(0, len(order), batch_size)]
        else:
            # A multiple of batch_size, so no micro-batch straddles two chunks.
            chunk = batch_size * max(1, GROUP_CHUNK // batch_size)
            batches = []
            for c in range(0, len(order), chunk):
                part = sorted(order[c: c + chunk], key=lambda j: len(examples[j].input_ids))
                batches += [part[i: i + batch_size] for i in range(0, len(part), batch_size)]
            rng.shuffle(batches)  # else every chunk would run shortest to longest
        for b in batches:
            yield epoch, [examples[j] for j in b]
        epoch += 1


def collate_padded(batch: list[Tokenized], pad_id: int, device: Any) -> dict[str, Any]:
    import torch

    width = max(len(t.input_ids) for t in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), width), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, t in enumerate(batch):  # right padding; padding is neither attended to nor learned
        n = len(t.input_ids)
        ids[row, :n] = torch.tensor(t.input_ids)
        labels[row, :n] = torch.tensor(t.labels)
        mask[row, :n] = 1
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device), "labels": labels.to(device)}


def pack_rows(batch: list[Tokenized], capacity: int) -> list[list[Tokenized]]:
    """First-fit, longest first, into rows of at most `capacity` tokens (every example fits alone)."""
    rows: list[list[Tokenized]] = []
    room: list[int] = []
    for t in sorted(batch, key=lambda t: -len(t.input_ids)):
        n = len(t.input_ids)
        for r, free in enumerate(room):
            if n <= free:
                rows[r].append(t)
                room[r] -= n
                break
        else:
            rows.append([t])
            room.append(capacity - n)
    return rows


def collate_packed(batch: list[Tokenized], pad_id: int, device: Any, capacity: int) -> dict[str, Any]:
    """input_ids, position_ids and labels of the packed rows; no attention_mask on purpose (with
    one, transformers would not look for example boundaries in position_ids)."""
    import torch

    # Rows no wider than the longest example: as few rows as padded batching would have at most,
    # and attention (quadratic in the row) no longer than that example's (15 % vs 31 % padding
    # left, and about twice as fast on the CPU, than rows filled up to max_seq_len).
    rows = pack_rows(batch, min(capacity, max(len(t.input_ids) for t in batch)))
    width = max(sum(len(t.input_ids) for t in row) for row in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE, dtype=torch.long)
    positions = torch.zeros((len(rows), width), dtype=torch.long)
    for r, row in enumerate(rows):
        at = 0
        for t in row:
            n = len(t.input_ids)
            ids[r, at: at + n] = torch.tensor(t.input_ids)
            labels[r, at: at + n] = torch.tensor(t.labels)
            # The previous example's last token must not learn to predict this one's first token
            # (unpacked, a row's first token is never predicted either).
            labels[r, at] = IGNORE
            positions[r, at: at + n] = torch.arange(n)
            at += n
        # The tail padding restarts at 0 too: a separate segment that attends only to itself.
        positions[r, at:] = torch.arange(width - at)
    return {"input_ids": ids.to(device), "position_ids": positions.to(device), "labels": labels.to(device)}


def collate(batch: list[Tokenized], pad_id: int, device: Any, mode: str, capacity: int) -> dict[str, Any]:
    if mode == "packed":
        return collate_packed(batch, pad_id, device, capacity)
    return collate_padded(batch, pad_id, device)


def trained_tokens(batch: list[Tokenized]) -> int:
    # The model shifts labels by one: the first token of each example is never predicted.
    return sum(sum(1 for x in t.labels[1:] if x != IGNORE) for t in batch)
