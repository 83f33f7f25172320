"""Dataset encoding: the loss mask covers assistant/completion tokens only, all three shapes,
truncation counted, settings validated. Needs only tokenizers + transformers (no model)."""

from __future__ import annotations

from typing import Any

import pytest

from machine.trainer.config import SettingsError, parse_settings
from machine.trainer.data import IGNORE, DatasetError, Tokenized, encode, normalise
from tests.support.trainer import encode_all
from tests.trainer.conftest import need_torch


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    need_torch()
    from machine.trainer.random_model import build_tokenizer

    return build_tokenizer(400)


def learned(tok: Any, t: Tokenized) -> str:
    return "".join(tok.decode([int(i)]) for i, lab in zip(t.input_ids, t.labels, strict=True) if lab != IGNORE)


def test_mask_covers_every_assistant_turn_only(tokenizer: Any) -> None:
    ex = normalise({"messages": [{"role": "system", "content": "Be brief."},
                                 {"role": "user", "content": "Hi?"},
                                 {"role": "assistant", "content": "Hello."},
                                 {"role": "user", "content": "Bye?"},
                                 {"role": "assistant", "content": "Farewell."}]})
    t = encode(tokenizer, ex, 1000)
    assert learned(tokenizer, t) == "Hello.<|im_end|>\nFarewell.<|im_end|>\n"
    assert t.labels[: len(t.labels) // 3] == [IGNORE] * (len(t.labels) // 3)
    assert all(lab in (IGNORE, i) for i, lab in zip(t.input_ids, t.labels, strict=True))


def test_prompt_completion_and_fallback_template(tokenizer: Any) -> None:
    ex = normalise({"prompt": "2+2?", "completion": "Four"})
    assert learned(tokenizer, encode(tokenizer, ex, 1000)) == "Four<|im_end|>\n"
    saved, tokenizer.chat_template = tokenizer.chat_template, None
    try:
        t = encode(tokenizer, ex, 1000)
        text = tokenizer.decode(t.input_ids)
        assert text == "User: 2+2?\nAssistant: Four\n"  # the fallback adds no special token
        assert learned(tokenizer, t) == " Four\n"
    finally:
        tokenizer.chat_template = saved


def test_text_rows_learn_every_token_and_truncation_is_counted(tokenizer: Any) -> None:
    rows = [normalise({"text": "the quick brown fox " * 20}), normalise({"text": "short"}),
            normalise({"messages": [{"role": "user", "content": "x " * 50}, {"role": "assistant", "content": "y"}]})]
    enc = encode_all(tokenizer, rows, 16)
    assert enc.truncated == 2 and enc.dropped == 1  # the chat row lost its answer to truncation
    assert [len(e.input_ids) for e in enc.examples] == [16, len(tokenizer("short")["input_ids"])]
    assert list(enc.examples[0].labels) == list(enc.examples[0].input_ids)


@pytest.mark.parametrize(("row", "fragment"), [
    ({"messages": []}, "non-empty list"),
    ({"messages": [{"role": "user", "content": "q"}]}, "at least one assistant"),
    ({"prompt": "p"}, "none of messages"),
    ({"text": 3}, "text must be a string"),
    ([1], "must be a JSON object"),
])
def test_bad_rows(row: Any, fragment: str) -> None:
    with pytest.raises(DatasetError, match=fragment):
        normalise(row, 7)


def test_settings() -> None:
    s, warnings = parse_settings('{"lora_r": 8, "target_modules": "all-linear", "max_steps": null, "new": 1}')
    assert s.lora_r == 8 and s.target_modules == "all-linear" and s.max_steps is None and s.lora_alpha == 32
    assert warnings == ["TENSORANT_TRAINING field 'new' is not known to this trainer and was ignored"]
    assert parse_settings(None)[0].learning_rate == 2e-4
    for raw, fragment in [('{"learning_rate": 0}', "learning_rate must be in (0.0"),
                          ('{"lora_r": true}', "lora_r must be a whole number"),
                          ('{"precision": "fp16"}', "precision must be one of auto, bf16, fp32"),
                          ('{"load_in_4bit": 1}', "load_in_4bit must be true or false"),
                          ("[1]", "must be a JSON object"), ("{", "not valid JSON")]:
        with pytest.raises(SettingsError, match=fragment.replace("(", r"\(")):
            parse_settings(raw)


# A Qwen2.5-style template: a conversation without a system message gets a default one.
DEFAULT_SYSTEM = ("{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are helpful.<|im_end|>\n"
                  "{% endif %}")


def test_a_first_assistant_message_learns_only_its_own_tokens(tokenizer: Any) -> None:
    ex = normalise({"messages": [{"role": "assistant", "content": "Ahoy."}, {"role": "user", "content": "Hi?"},
                                 {"role": "assistant", "content": "Arr."}]})
    saved = tokenizer.chat_template
    try:
        for template in (saved, DEFAULT_SYSTEM + saved):
            tokenizer.chat_template = template
            t = encode(tokenizer, ex, 1000)
            # Not the default system prompt nor the "<|im_start|>assistant\n" header.
            assert learned(tokenizer, t) == "Ahoy.<|im_end|>\nArr.<|im_end|>\n"
    finally:
        tokenizer.chat_template = saved


def test_a_truncated_answer_keeps_its_end_of_turn_tokens(tokenizer: Any) -> None:
    ex = normalise({"prompt": "Count.", "completion": "one two three four five six seven eight nine ten"})
    full = encode(tokenizer, ex, 1000)
    n_prompt = list(full.labels).index(next(x for x in full.labels if x != IGNORE))
    limit = n_prompt + 4
    t = encode(tokenizer, ex, limit)
    assert t.truncated and len(t.input_ids) == limit
    text = learned(tokenizer, t)
    assert text.endswith("<|im_end|>\n") and "one".startswith(text[:2]), text
    # The prompt is untouched, and a cut that leaves no answer token keeps no lone end marker.
    assert t.input_ids[:n_prompt] == full.input_ids[:n_prompt]
    bare = encode(tokenizer, ex, n_prompt + 1)
    assert learned(tokenizer, bare) == tokenizer.decode([full.input_ids[n_prompt]])
