"""Batching without compute on padding, and the loss without full logits: each must give the same
token-weighted loss (and gradients) as every example computed alone with transformers' own loss."""

from __future__ import annotations

import random
from typing import Any

import pytest

from machine.trainer.batches import (
    FLEX,
    SEGMENTS,
    batch_stream,
    candidates,
    choose_batching,
    collate,
    packed_attentions,
    trained_tokens,
    use_segment_attention,
    wants_probe,
)
from machine.trainer.config import SettingsError, parse_settings
from machine.trainer.data import IGNORE, Tokenized
from tests.trainer.conftest import need_torch

ARCHS = ("tensorant/tiny-llama", "tensorant/tiny-qwen2")


def examples(n: int, seed: int = 0, vocab: int = 500) -> list[Tokenized]:
    """Chat-like rows: a prompt (not learned) then an answer (learned), 3 to 40 tokens in all."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        ids = [rng.randrange(3, vocab) for _ in range(rng.randint(3, 40))]
        prompt = rng.randint(1, len(ids) - 1)
        out.append(Tokenized(ids, [IGNORE] * prompt + ids[prompt:]))
    return out


def model_of(name: str, vocab: int | None = None) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    from machine.trainer.random_model import declared

    config = declared(name).hf_config()
    if vocab:
        config.vocab_size = vocab
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def alone(model: Any, batch: list[Tokenized]) -> Any:
    """Reference: each example on its own row, no padding, transformers' mean loss x its tokens."""
    import torch

    total = 0
    for t in batch:
        n = trained_tokens([t])
        if n:
            out = model(input_ids=torch.tensor([t.input_ids]), labels=torch.tensor([t.labels]))
            total = total + out.loss * n
    return total


@pytest.mark.parametrize("name", ARCHS)
def test_every_batching_gives_the_loss_and_gradients_of_each_example_alone(name: str) -> None:
    need_torch()
    import torch

    from machine.trainer.loss import loss_sum

    torch.set_num_threads(1)
    model = model_of(name)
    batch = examples(6, seed=1)
    n = trained_tokens(batch)
    reference = alone(model, batch)
    reference.backward()
    expected = {k: p.grad.clone() for k, p in model.named_parameters()}
    # Packed twice: under transformers' sdpa (a block-diagonal mask over the row), then per example
    # (segment_attention), which must also leave padded batches exactly as sdpa computes them.
    for mode, segments in (("padded", False), ("grouped", False), ("packed", False), ("packed", True),
                           ("padded", True)):
        if segments and model.config._attn_implementation != SEGMENTS:
            assert use_segment_attention(model) and model.config._attn_implementation == SEGMENTS
        model.zero_grad()
        inputs = collate(batch, 0, "cpu", mode)
        if mode == "packed":
            assert inputs["input_ids"].shape[0] == 1 and "attention_mask" not in inputs
        got = loss_sum(model, inputs, n)
        assert torch.allclose(got, reference, rtol=1e-5, atol=1e-5), (mode, segments, float(got), float(reference))
        got.backward()
        for k, p in model.named_parameters():
            assert torch.allclose(p.grad, expected[k], rtol=1e-4, atol=1e-6), (mode, segments, k)


def eager_flex(monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers' flex attention path with torch's flex attention uncompiled: its block mask built by
    create_block_mask's own code and its scores by flex attention's reference (dense) implementation, in
    seconds instead of a minute of Inductor compiling for the CPU. The mask and the per-document
    result are what is tested; the compiled kernel is the GPU check's (tests/gpu/check_training.py)."""
    import transformers.integrations.flex_attention as hf_flex
    import transformers.masking_utils as masking
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def uncompiled_mask(*args: Any, _compile: bool = False, **kwargs: Any) -> Any:
        return create_block_mask(*args, **kwargs)

    def uncompiled(query: Any, key: Any, value: Any, training: bool = False, **kwargs: Any) -> Any:
        return flex_attention(query, key, value, **kwargs)

    monkeypatch.setattr(masking, "create_block_mask", uncompiled_mask)
    monkeypatch.setattr(hf_flex, "compile_friendly_flex_attention", uncompiled)


@pytest.mark.parametrize("name", ARCHS)
def test_packed_under_flex_attention_gives_the_loss_of_each_example_alone(name: str,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The packed row under transformers' flex_attention: the loss of every example alone, forward only
    (torch 2.13 has no flex attention backward on the CPU, so training under flex is GPU-only and its
    gradients are the GPU check's; forward and backward are one masked computation)."""
    need_torch()
    import torch

    from machine.trainer.loss import loss_sum

    torch.set_num_threads(1)
    eager_flex(monkeypatch)
    model = model_of(name)
    batch = examples(6, seed=1)
    n = trained_tokens(batch)
    with torch.no_grad():
        reference = alone(model, batch)
        model.set_attn_implementation(FLEX)
        assert model.config._attn_implementation == FLEX
        got = loss_sum(model, collate(batch, 0, "cpu", "packed"), n)
        grouped = loss_sum(model, collate(batch, 0, "cpu", "grouped"), n)  # padded rows under flex: a padding mask
    assert torch.allclose(got, reference, rtol=1e-5, atol=1e-5), (float(got), float(reference))
    assert torch.allclose(grouped, reference, rtol=1e-5, atol=1e-5), (float(grouped), float(reference))
    with pytest.raises(NotImplementedError, match="backward on CPU"):  # why flex is never chosen on the CPU
        loss_sum(model, collate(batch, 0, "cpu", "packed"), n)


def test_flex_block_mask_of_a_packed_row_is_each_example_causal_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The block mask transformers builds for a packed row (no attention mask, position ids restarting at
    each example) lets each token see exactly the earlier tokens of its own example."""
    need_torch()
    import torch
    from torch.nn.attention.flex_attention import BlockMask, create_mask
    from transformers.masking_utils import create_causal_mask

    eager_flex(monkeypatch)
    model = model_of("tensorant/tiny-qwen2")
    model.set_attn_implementation(FLEX)
    batch = examples(7, seed=5)
    inputs = collate(batch, 0, "cpu", "packed")
    length = inputs["input_ids"].shape[1]
    embeds = model.get_input_embeddings()(inputs["input_ids"])
    mask = create_causal_mask(model.config, embeds, None, None, position_ids=inputs["position_ids"])
    assert isinstance(mask, BlockMask)
    dense = create_mask(mask.mask_mod, 1, 1, length, length, "cpu")[0, 0]
    document = torch.repeat_interleave(torch.arange(len(batch)), torch.tensor([len(t.input_ids) for t in batch]))
    where = torch.arange(length)
    want = (document[:, None] == document[None, :]) & (where[:, None] >= where[None, :])
    assert torch.equal(dense, want)
    # The same row with the examples' boundaries moved by one token is another mask: the test can fail.
    shifted = inputs["position_ids"].roll(1, dims=1)
    other = create_causal_mask(model.config, embeds, None, None, position_ids=shifted)
    assert not torch.equal(create_mask(other.mask_mod, 1, 1, length, length, "cpu")[0, 0], want)


def test_chunked_loss_equals_the_full_logits_loss() -> None:
    need_torch()
    import torch

    from machine.trainer.loss import chunked_loss_sum

    torch.set_num_threads(1)
    model = model_of("tensorant/tiny-qwen2", vocab=5000)
    batch = examples(4, seed=2, vocab=5000)
    inputs = collate(batch, 0, "cpu", "padded")
    n = trained_tokens(batch)
    plain = model(**inputs).loss * n
    plain.backward()
    expected = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    hidden = model.get_decoder()(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).last_hidden_state
    chunked = chunked_loss_sum(model.get_output_embeddings(), hidden, inputs["labels"], chunk=7)  # many chunks
    assert torch.allclose(chunked, plain, rtol=1e-5), (float(chunked), float(plain))
    chunked.backward()
    for k, p in model.named_parameters():  # the tied embedding/head included
        assert torch.allclose(p.grad, expected[k], rtol=1e-4, atol=1e-6), k


def test_grouped_batches_cover_each_epoch_once_with_less_padding() -> None:
    data = examples(200, seed=3)
    for t in data:
        t.labels[-1] = t.input_ids[-1]  # identity check below needs unique objects only

    def padding(grouped: bool) -> tuple[float, list[list[int]]]:
        stream = batch_stream(data, 8, seed=5, grouped=grouped)
        real = width = 0
        epochs: list[list[int]] = [[], []]
        for _ in range(2 * 25):
            epoch, batch = next(stream)
            epochs[epoch] += [id(t) for t in batch]
            real += sum(len(t.input_ids) for t in batch)
            width += len(batch) * max(len(t.input_ids) for t in batch)
        return 1 - real / width, epochs

    padded, _ = padding(False)
    grouped, epochs = padding(True)
    assert all(sorted(e) == sorted(id(t) for t in data) for e in epochs)
    assert epochs[0] != epochs[1]  # a fresh order each epoch
    assert grouped < padded / 3, (grouped, padded)
    first = [[id(t) for t in b] for _, b in (next(batch_stream(data, 8, 5, grouped=True)) for _ in range(1))]
    again = [[id(t) for t in b] for _, b in (next(batch_stream(data, 8, 5, grouped=True)) for _ in range(1))]
    assert first == again  # deterministic with the seed


def test_packing_lays_the_micro_batch_end_to_end_without_padding() -> None:
    need_torch()
    data = examples(5, seed=4)
    inputs = collate(data, 0, "cpu", "packed")
    lengths = [len(t.input_ids) for t in data]
    assert list(inputs["input_ids"].shape) == [1, sum(lengths)]  # one row, not one padding token
    assert inputs["example_starts"].tolist() == [sum(lengths[:i]) for i in range(len(data) + 1)]
    at = 0
    for t, n in zip(data, lengths, strict=True):
        assert inputs["input_ids"][0, at: at + n].tolist() == t.input_ids
        assert inputs["position_ids"][0, at: at + n].tolist() == list(range(n))  # restart at each example
        # The first token is never a target: the row's previous token belongs to another example.
        assert inputs["labels"][0, at: at + n].tolist() == [IGNORE, *t.labels[1:]]
        at += n
    assert int((inputs["labels"][0, 1:] != IGNORE).sum()) == trained_tokens(data)


def test_batching_setting() -> None:
    assert parse_settings('{"batching": "grouped"}')[0].batching == "grouped"
    assert parse_settings(None)[0].batching == "auto"
    with pytest.raises(SettingsError, match="batching must be one of auto, padded, grouped, packed"):
        parse_settings('{"batching": "pack"}')
    assert choose_batching("auto", "llama", "sdpa", cuda=False) == "packed"  # measured fastest on the CPU
    assert choose_batching("auto", "llama", "sdpa", cuda=True) == "grouped"  # not measured on a GPU yet
    assert choose_batching("auto", "llama", "eager", cuda=False) == "grouped"  # no per-example attention there
    assert choose_batching("auto", "qwen2", "flash_attention_2", cuda=True) == "packed"
    assert choose_batching("auto", "gemma2", "flash_attention_2", cuda=True) == "grouped"
    assert choose_batching("auto", "gemma2", "sdpa", cuda=False) == "grouped"
    assert choose_batching("packed", "gpt2", "sdpa", cuda=False) == "grouped"  # would let examples attend to each other
    assert choose_batching("packed", "llama", "sdpa", cuda=True) == "packed"
    assert choose_batching("padded", "llama", "sdpa", cuda=False) == "padded"


def test_packed_attention_setting_and_the_probed_candidates(monkeypatch: pytest.MonkeyPatch) -> None:
    from machine.trainer import batches

    assert parse_settings('{"packed_attention": "flex"}')[0].packed_attention == "flex"
    assert parse_settings(None)[0].packed_attention == "auto"
    with pytest.raises(SettingsError, match="packed_attention must be one of auto, segments, flex"):
        parse_settings('{"packed_attention": "flash"}')
    # The CPU: flex attention cannot train there (no backward), so segments only, and no probe.
    assert not batches.flex_trainable(cuda=False)
    assert candidates("auto", "auto", "llama", "sdpa", cuda=False) == [("packed", SEGMENTS)]
    assert packed_attentions("auto", "sdpa", cuda=False) == [SEGMENTS]
    monkeypatch.setattr(batches, "flex_trainable", lambda cuda: cuda)  # a GPU with Triton
    # A GPU under sdpa: grouped, packed per example and packed under flex, timed against each other.
    assert candidates("auto", "auto", "qwen2", "sdpa", cuda=True) == [
        ("grouped", "sdpa"), ("packed", SEGMENTS), ("packed", FLEX)]
    # The model is switched to segment attention before the choice: still sdpa's candidates.
    assert wants_probe("auto", "llama", SEGMENTS, cuda=True)
    assert candidates("auto", "auto", "llama", SEGMENTS, cuda=True)[0] == ("grouped", SEGMENTS)
    assert candidates("packed", "auto", "llama", "sdpa", cuda=True) == [("packed", SEGMENTS), ("packed", FLEX)]
    assert candidates("auto", "segments", "llama", "sdpa", cuda=True) == [("grouped", "sdpa"), ("packed", SEGMENTS)]
    assert candidates("packed", "flex", "llama", "sdpa", cuda=True) == [("packed", FLEX)]
    assert candidates("grouped", "flex", "llama", "sdpa", cuda=True) == [("grouped", "sdpa")]
    assert candidates("auto", "auto", "llama", "flash_attention_2", cuda=True) == [("packed", "flash_attention_2")]
    assert candidates("auto", "auto", "gemma2", "sdpa", cuda=True) == [("grouped", "sdpa")]  # not packable
    assert candidates("auto", "auto", "llama", "eager", cuda=False) == [("grouped", "eager")]
