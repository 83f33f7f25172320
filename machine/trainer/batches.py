"""Micro-batches without compute on padding (the `batching` training setting).

  padded   each micro-batch is batch_size random examples, right-padded to the longest: the
           first trainer's behaviour; on a chat set of 20-250-token answers about 40 % of the
           compute went to padding.
  grouped  the same examples per epoch, but each chunk of GROUP_CHUNK shuffled examples is sorted
           by length and cut into micro-batches, and the micro-batch order is shuffled again:
           rows of a batch have similar lengths, so little padding is left (~5 % measured).
  packed   each micro-batch of batch_size random examples is laid out end to end in one row, with
           position ids restarting at 0 at each example and no attention mask: no padding at all.
           Attention stays within each example: under sdpa the model is switched to
           segment_attention (causal sdpa per example, sliced from the row), under flash attention
           transformers' varlen kernels find the examples in the position ids, and under eager
           transformers builds a block-diagonal causal mask (attention then costs as much as one
           example the length of the whole row), and under flex attention (`packed_attention`,
           GPU only: torch has no flex backward on the CPU) transformers builds a block-sparse
           document mask from the position ids and torch compiles one kernel for the row. Each
           example is computed as if alone.

Every mode gives the same examples per micro-batch count (batch_size), so steps, epochs and the
token-weighted loss mean the same thing whichever is chosen. Streams are deterministic with the seed.
"""

from __future__ import annotations

import importlib.util
import itertools
import random
from collections.abc import Iterator, Sequence
from typing import Any

from machine.trainer.data import IGNORE, Tokenized

GROUP_CHUNK = 64  # examples sorted together: large enough to find similar lengths, small enough to stay random
# Decoder architectures whose transformers attention honours packed position ids (masking_utils'
# packed-sequence detection); others are trained `grouped`.
PACKABLE = frozenset({"llama", "mistral", "qwen2", "qwen3"})
SEGMENTS = "tensorant_segments"  # segment_attention's registered name
FLEX = "flex_attention"  # transformers' own: a block mask per packed row, from its position ids
SDPA_LIKE = ("sdpa", SEGMENTS)  # segment_attention is sdpa wherever a row is not packed


def choose_batching(setting: str, model_type: str, attention: str | None, *, cuda: bool) -> str:
    """The batching mode to use (setting: the `batching` training setting; attention: the model's
    config._attn_implementation; cuda: training on a GPU).

    auto: packed where it is measured fastest. On the CPU under sdpa (segment_attention) by a rule
    from measured figures (SmolLM2-135M, fp32, one thread, batch 4 x 2, 8 steps, chat rows of
    20-250 answer tokens; tests/bench/trainers_bench.py): packed 101 real tokens per CPU-second,
    grouped 97 (1.4 % padding left on 300 rows), a plain padded transformers loop 72; on a skewed
    set the gap is wider (the issue's check: 80.9 against 69.2 bare packed and 37.6 padded). Under
    flash attention (varlen kernels) packed. On a GPU under sdpa the answer depends on the GPU, the
    model and the lengths (one sdpa call per example and layer against padded batches' one call, or
    flex attention's one compiled kernel per row): wants_probe says so, and
    machine.trainer.gpu.probe_batching times grouped and packed under each of packed_attentions on
    the run's own data (candidates); grouped is what this returns for it until measured."""
    if setting == "packed" and model_type not in PACKABLE:
        return "grouped"  # packing would silently let examples attend to each other
    if setting != "auto":
        return setting
    if model_type in PACKABLE and (attention == "flash_attention_2" or (not cuda and attention in SDPA_LIKE)):
        return "packed"
    return "grouped"


def wants_probe(setting: str, model_type: str, attention: str | None, *, cuda: bool) -> bool:
    """True where `auto` is decided by timing grouped against packed (a GPU under sdpa)."""
    return setting == "auto" and cuda and model_type in PACKABLE and attention in SDPA_LIKE


def flex_trainable(cuda: bool) -> bool:
    """Whether flex attention can train here: torch (2.13) has no flex attention backward on the CPU
    (NotImplementedError), and on a GPU it compiles its kernels with Triton."""
    if not cuda or importlib.util.find_spec("triton") is None:
        return False
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def packed_attentions(setting: str, attention: str | None, *, cuda: bool) -> list[str]:
    """The attention implementations a packed row may run under, the default first (setting: the
    `packed_attention` training setting; attention: the one the model was loaded with). auto on a
    GPU under sdpa: segment_attention and flex attention, timed against each other."""
    if setting == "flex":
        return [FLEX]
    if attention not in SDPA_LIKE:  # flash_attention_2: varlen kernels; eager: a block-diagonal mask
        return [attention] if attention else []
    if setting == "segments" or not flex_trainable(cuda):
        return [SEGMENTS]
    return [SEGMENTS, FLEX]


def candidates(setting: str, packed_attention: str, model_type: str, attention: str | None, *,
               cuda: bool) -> list[tuple[str, str | None]]:
    """The (batching mode, attention implementation) pairs this run may train with, the default first;
    more than one: `auto` is decided by timing them all on the run's own rows (gpu.probe_batching).
    Padded and grouped batches keep the attention the model was loaded with."""
    if wants_probe(setting, model_type, attention, cuda=cuda):
        modes = ["grouped", "packed"]
    else:
        modes = [choose_batching(setting, model_type, attention, cuda=cuda)]
    out: list[tuple[str, str | None]] = []
    for mode in modes:
        out += [(mode, a) for a in packed_attentions(packed_attention, attention, cuda=cuda)] if mode == "packed" \
            else [(mode, attention)]
    return out


def batch_stream(examples: Sequence[Tokenized], batch_size: int, seed: int, *, grouped: bool) -> Iterator[
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
        ids[row, :n] = torch.as_tensor(t.input_ids)  # no copy of a numpy example
        labels[row, :n] = torch.as_tensor(t.labels)
        mask[row, :n] = 1
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device), "labels": labels.to(device)}


def collate_packed(batch: list[Tokenized], device: Any) -> dict[str, Any]:
    """input_ids, position_ids and labels of one row holding the whole micro-batch, and
    example_starts (on the CPU: only ever read as slice bounds) for segment_attention. No
    attention_mask on purpose: with one, transformers would not look for example boundaries in
    position_ids."""
    import torch

    lengths = [len(t.input_ids) for t in batch]
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    ids = torch.cat([torch.as_tensor(t.input_ids) for t in batch]).long()  # no copy of a numpy example before this
    labels = torch.cat([torch.as_tensor(t.labels) for t in batch]).long()
    # The previous example's last token must not learn to predict this one's first token
    # (unpacked, a row's first token is never predicted either).
    labels[starts[:-1]] = IGNORE
    positions = torch.cat([torch.arange(n) for n in lengths])
    return {"input_ids": ids[None].to(device), "position_ids": positions[None].to(device),
            "labels": labels[None].to(device), "example_starts": torch.tensor(starts)}


def collate(batch: list[Tokenized], pad_id: int, device: Any, mode: str) -> dict[str, Any]:
    """The model inputs of one micro-batch (packed: the whole micro-batch in one row)."""
    if mode == "packed":
        return collate_packed(batch, device)
    return collate_padded(batch, pad_id, device)


def segment_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, dropout: float = 0.0,
                      scaling: float | None = None, **kwargs: Any) -> tuple[Any, None]:
    """sdpa, except on a packed row (example_starts given): causal sdpa within each example, so
    attention costs what the examples alone cost, not the whole row's square under a
    block-diagonal mask (which would be ignored here). query [1, heads, seq, dim]; key and value
    may have fewer heads (grouped-query attention)."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    starts = kwargs.get("example_starts")
    if starts is None or query.shape[0] != 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    bounds = starts.tolist()
    parts = [torch.nn.functional.scaled_dot_product_attention(
        query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], dropout_p=dropout if module.training else 0.0,
        is_causal=True, scale=scaling, enable_gqa=query.shape[1] != key.shape[1])
        for a, b in itertools.pairwise(bounds)]
    # sdpa_attention_forward's layout: [batch, seq, heads, dim]
    return torch.cat(parts, dim=2).transpose(1, 2).contiguous(), None


def use_segment_attention(model: Any) -> bool:
    """Switch a model that computes sdpa attention to segment_attention (the same numbers for
    padded batches and generation, which it hands to sdpa with sdpa's mask); True if switched."""
    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return False
    set_attention(model, SEGMENTS)
    return True


def set_attention(model: Any, name: str | None) -> None:
    """Switch the model's attention implementation (segment_attention registered on first use)."""
    if name is None or getattr(model.config, "_attn_implementation", None) == name:
        return
    if name == SEGMENTS:
        from transformers import AttentionInterface
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

        AttentionInterface.register(SEGMENTS, segment_attention)
        ALL_MASK_ATTENTION_FUNCTIONS.register(SEGMENTS, sdpa_mask)
    model.set_attn_implementation(name)


def trained_tokens(batch: list[Tokenized]) -> int:
    # The model shifts labels by one: the first token of each example is never predicted.
    return sum(sum(1 for x in t.labels[1:] if x != IGNORE) for t in batch)
