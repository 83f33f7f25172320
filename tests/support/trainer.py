"""The trainer's data paths in the forms tests and benches hold in memory (the trainer itself scans the dataset
file and encodes its splits from disk: machine.trainer.data.scan_dataset, encoding.encode_splits)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from machine.trainer.data import Encoded, Example, Tokenized, encode, scan_dataset
from machine.trainer.encoding import CHUNK_ROWS, Encoder, TokenStore


def load_examples(path: str | Path) -> list[Example]:
    """Every row, checked and parsed as the trainer reads them (same errors), held in memory."""
    return [example for _, example in scan_dataset(path).read()]


def encode_all(tokenizer: Any, examples: list[Example], max_seq_len: int) -> Encoded:
    """Every example encoded by the trainer's batch path (compact arrays), in order; rows left with no
    trained token are counted in `dropped` and left out."""
    encoder, store = Encoder(tokenizer, max_seq_len), TokenStore()
    for start in range(0, len(examples), CHUNK_ROWS):
        store.append(encoder.encode(examples[start:start + CHUNK_ROWS]))
    store.freeze()
    return store.select(np.arange(len(store)))


def encode_each(tokenizer: Any, examples: list[Example], max_seq_len: int) -> Encoded:
    """encode_all row by row with Python lists (how it was before the batch path): the reference the
    batch path is checked against (tests/trainer/test_encoding.py) and measured against (data_bench)."""
    kept: list[Tokenized] = []
    truncated = dropped = 0
    for example in examples:
        t = encode(tokenizer, example, max_seq_len)
        truncated += t.truncated
        if t.trained_tokens == 0:
            dropped += 1
        else:
            kept.append(t)
    return Encoded(kept, truncated, dropped)
