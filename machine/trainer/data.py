"""Dataset rows -> token ids and labels, with the loss on assistant/completion tokens only.

Three row shapes (the ones dataset upload accepts):
  {"messages": [{"role", "content"}, ...]}  chat; loss on every assistant turn
  {"prompt": ..., "completion": ...}        rendered as one user turn + one assistant turn
  {"text": ...}                             plain text; loss on every token

Chat rows go through the tokenizer's chat template, or, when it has none, FALLBACK_TEMPLATE,
which adds no special tokens (a base model's tokenizer may have none to add). Assistant spans
are found in characters by rendering the conversation turn by turn (the text up to and
including the generation prompt, then up to the end of the assistant turn), and mapped to
tokens with the fast tokenizer's offsets, so any template that renders prefixes consistently
works without a {% generation %} block. Labels are -100 everywhere else.

Where a turn's own text begins and its end-of-turn marker (e.g. "<|im_end|>\n") begins are found
by rendering the turn with a sentinel in place of its content: the text before the sentinel is
the prefix (for a first assistant message, the template's default system prompt and the role
header, which must not be learned), the text after it is the end marker. A row cut by max_seq_len
inside an assistant turn keeps that turn's end marker, so a truncated answer still teaches stopping.

`encode` is the per-row definition of all this; a training set is encoded in batches by
machine.trainer.encoding (same ids and labels, into compact arrays), and read from disk as a
`DatasetRows`: checked once, then streamed again when encoded instead of held as parsed rows.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

IGNORE = -100
# No special tokens on purpose: with no chat template we cannot know what the model expects.
FALLBACK_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}{{ m['content'] }}\n\n"
    "{% elif m['role'] == 'user' %}User: {{ m['content'] }}\n"
    "{% else %}Assistant: {{ m['content'] }}\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)


class DatasetError(ValueError):
    """A dataset row is not one of the three accepted shapes; the message names the line."""


@dataclass
class Example:
    """One row, normalised: either a conversation or plain text."""

    messages: list[dict[str, str]] | None = None
    text: str | None = None
    # A preference pair (method dpo): `messages` is the conversation before the answer, these the two answers.
    chosen: str | None = None
    rejected: str | None = None


@dataclass
class Tokenized:
    """One encoded example: lists from `encode`, int32 numpy views from a batch-encoded set
    (machine.trainer.encoding); both support len(), slicing and torch.as_tensor."""

    input_ids: list[int] | np.ndarray
    labels: list[int] | np.ndarray
    truncated: bool = False

    @property
    def trained_tokens(self) -> int:
        if isinstance(self.labels, np.ndarray):
            return int(np.count_nonzero(self.labels != IGNORE))
        return sum(1 for x in self.labels if x != IGNORE)


@dataclass
class Encoded:
    examples: Sequence[Tokenized] = field(default_factory=list)
    truncated: int = 0
    dropped: int = 0  # rows with no trained token left after truncation


def _lines(path: str | Path) -> Iterator[tuple[int, int, str]]:
    """(row index, line number, line) for each non-blank line: blank lines are not rows."""
    index = 0
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if line.strip():
                yield index, number, line
                index += 1


def _parse(line: str, number: int) -> Example:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DatasetError(f"dataset line {number} is not valid JSON ({exc.msg})") from exc
    return normalise(row, number)


@dataclass(frozen=True)
class DatasetRows:
    """A dataset file whose rows were all checked (scan_dataset) but are not held (parsed JSON rows
    would stay in memory for the whole run): they are read again from disk when needed."""

    path: Path
    count: int

    def __len__(self) -> int:
        return self.count

    def read(self, wanted: Sequence[bool] | np.ndarray | None = None) -> Iterator[tuple[int, Example]]:
        """(row index, row) in file order, for the rows whose `wanted[index]` is true (every row when
        None); the others are not parsed."""
        for index, number, line in _lines(self.path):
            if wanted is None or wanted[index]:
                yield index, _parse(line, number)

    def examples(self, indices: Sequence[int]) -> list[Example]:
        """The rows at `indices`, in that order (one pass over the file)."""
        wanted = np.zeros(self.count, dtype=bool)
        wanted[list(indices)] = True
        found = dict(self.read(wanted))
        return [found[i] for i in indices]


def scan_dataset(path: str | Path) -> DatasetRows:
    """Check every row (a row that is not valid JSON or not a training example raises DatasetError), keeping
    only the row count."""
    count = 0
    for _, number, line in _lines(path):
        _parse(line, number)
        count += 1
    if not count:
        raise DatasetError("the dataset has no rows")
    return DatasetRows(Path(path), count)


def normalise(row: Any, number: int = 0) -> Example:
    where = f"dataset line {number}"
    if not isinstance(row, dict):
        raise DatasetError(f"{where} must be a JSON object")
    if "chosen" in row or "rejected" in row:
        return _pair(row, number)
    if "messages" in row:
        return Example(messages=_conversation(row["messages"], where))
    if "prompt" in row and "completion" in row:
        if not (isinstance(row["prompt"], str) and isinstance(row["completion"], str)):
            raise DatasetError(f"{where}: prompt and completion must be strings")
        return Example(messages=[{"role": "user", "content": row["prompt"]},
                                 {"role": "assistant", "content": row["completion"]}])
    if "text" in row:
        if not isinstance(row["text"], str):
            raise DatasetError(f"{where}: text must be a string")
        return Example(text=row["text"])
    raise DatasetError(f"{where} has none of messages, prompt+completion, text")


def _conversation(messages: Any, where: str) -> list[dict[str, str]]:
    """A row's messages, each its role and content only; DatasetError unless a non-empty list of them with an
    assistant message among them."""
    if not isinstance(messages, list) or not messages:
        raise DatasetError(f"{where}: messages must be a non-empty list")
    clean = []
    for m in messages:
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise DatasetError(f"{where}: every message needs a string role and content")
        clean.append({"role": m["role"], "content": m["content"]})
    if not any(m["role"] == "assistant" for m in clean):
        raise DatasetError(f"{where}: a conversation needs at least one assistant message to learn from")
    return clean


def _pair(row: dict[str, Any], number: int) -> Example:
    """A preference pair: {"prompt", "chosen", "rejected"} (strings), or {"messages" (ending before the
    answer), "chosen", "rejected"} with each answer an assistant turn {"role": "assistant", "content"}."""
    where = f"dataset line {number}"
    answers = []
    for side in ("chosen", "rejected"):
        value = row.get(side)
        if isinstance(value, dict) and value.get("role") == "assistant":
            value = value.get("content")
        if not isinstance(value, str) or not value:
            raise DatasetError(f"{where}: {side} must be a non-empty string or an assistant turn")
        answers.append(value)
    if "messages" in row:
        prompt = normalise({"messages": [*row["messages"], {"role": "assistant", "content": "-"}]}, number).messages
        assert prompt is not None
        messages = prompt[:-1]
        if messages[-1]["role"] == "assistant":
            raise DatasetError(f"{where}: a pair's messages must end before the answer")
    elif isinstance(row.get("prompt"), str):
        messages = [{"role": "user", "content": row["prompt"]}]
    else:
        raise DatasetError(f"{where}: a preference pair needs prompt (or messages), chosen and rejected")
    return Example(messages=messages, chosen=answers[0], rejected=answers[1])


def chat_template(tokenizer: Any) -> str:
    return getattr(tokenizer, "chat_template", None) or FALLBACK_TEMPLATE


def render(tokenizer: Any, messages: list[dict[str, str]], *, add_generation_prompt: bool) -> str:
    text = tokenizer.apply_chat_template(messages, chat_template=chat_template(tokenizer), tokenize=False,
                                         add_generation_prompt=add_generation_prompt)
    return str(text)


# Stands in for a message's content to find where a template puts it; no template alters it.
SENTINEL = "TENSORANTSENTINEL7F3A"


# (messages, add_generation_prompt) -> the rendered text: `render` itself, or a stand-in proven to
# give the same text (machine.trainer.encoding.SkeletonRenderer).
Renderer = Callable[[list[dict[str, str]], bool], str]


def template_renderer(tokenizer: Any) -> Renderer:
    return lambda messages, generation: render(tokenizer, messages, add_generation_prompt=generation)


def turn_parts(tokenizer: Any, messages: list[dict[str, str]], i: int,
               renderer: Renderer | None = None) -> tuple[str, str]:
    """(the text before message i's content, the text after it) when the conversation ends at i."""
    draw = renderer or template_renderer(tokenizer)
    marked = draw([*messages[:i], {"role": messages[i]["role"], "content": SENTINEL}], False)
    head, _, tail = marked.partition(SENTINEL)
    return head, tail


def assistant_spans(tokenizer: Any, messages: list[dict[str, str]],
                    renderer: Renderer | None = None) -> tuple[str, list[tuple[int, int, int]]]:
    """The rendered conversation and, per assistant turn, (start, stop, end) character offsets:
    [start, end) is learned; [stop, end) is its end-of-turn marker (stop == end when unknown)."""
    draw = renderer or template_renderer(tokenizer)
    full = draw(messages, False)
    spans: list[tuple[int, int, int]] = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        through = draw(messages[: i + 1], False)
        head, tail = turn_parts(tokenizer, messages, i, draw)
        # Not the empty text when i == 0: a template may open every conversation with a default
        # system prompt and the assistant header, which are the template's, not the answer.
        before = draw(messages[:i], True) if i else head
        if full.startswith(through) and through.startswith(before):
            start, end = len(before), len(through)
        else:
            # A template that renders prefixes differently (e.g. it drops earlier reasoning):
            # fall back to the content itself, searched after the previous span.
            start = full.find(m["content"], spans[-1][2] if spans else 0)
            if start < 0:
                continue
            end = start + len(m["content"])
        stop = end - len(tail) if tail and through.endswith(tail) and end - len(tail) > start else end
        spans.append((start, stop, end))
    return full, spans


def encode(tokenizer: Any, example: Example, max_seq_len: int) -> Tokenized:
    """Token ids and labels for one example, truncated to max_seq_len tokens: the reference that
    machine.trainer.encoding's batch path must match token for token (tests/trainer/test_encoding.py)."""
    if example.text is not None:
        ids = list(tokenizer(example.text, add_special_tokens=True)["input_ids"])
        return Tokenized(ids[:max_seq_len], ids[:max_seq_len], len(ids) > max_seq_len)
    assert example.messages is not None
    text, spans = assistant_spans(tokenizer, example.messages)
    # The template already holds any special tokens (BOS, turn markers): add none.
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    labels: list[int] = []
    turn: list[int] = []  # per token: the index of its assistant span, or -1
    marker: list[bool] = []  # per token: part of its turn's end-of-turn marker
    for token, (start, _end) in zip(ids, enc["offset_mapping"], strict=True):
        # A token belongs to the turn its first character is in (the turn's end marker included).
        k = next((k for k, (s, _stop, e) in enumerate(spans) if s <= start < e), -1)
        labels.append(token if k >= 0 else IGNORE)
        turn.append(k)
        marker.append(k >= 0 and start >= spans[k][1])
    if len(ids) <= max_seq_len:
        return Tokenized(ids, labels)
    keep = list(range(max_seq_len))
    k = turn[max_seq_len]  # the turn the cut falls in
    if k >= 0:
        ends = [j for j in range(len(ids)) if turn[j] == k and marker[j]]
        cut = max_seq_len - len(ends)
        # Only when some of the answer stays: an end marker alone would teach an empty answer.
        if ends and cut > turn.index(k):
            keep = list(range(cut)) + ends
    return Tokenized([ids[j] for j in keep], [labels[j] for j in keep], True)


def sample_prompt(tokenizer: Any, example: Example) -> tuple[str, str]:
    """(prompt text to generate from, the dataset's own answer) for a held-out example."""
    if example.chosen is not None and example.messages is not None:
        return render(tokenizer, example.messages, add_generation_prompt=True), example.chosen
    if example.messages is not None:
        last = max(i for i, m in enumerate(example.messages) if m["role"] == "assistant")
        prompt = (render(tokenizer, example.messages[:last], add_generation_prompt=True) if last
                  else turn_parts(tokenizer, example.messages, 0)[0])
        return prompt, example.messages[last]["content"]
    assert example.text is not None
    words = example.text.split()
    cut = max(1, min(12, len(words) // 2))
    return " ".join(words[:cut]), " ".join(words[cut:])
