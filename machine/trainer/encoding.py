"""A training set encoded in batches into compact arrays: the same ids and labels as
machine.trainer.data.encode gives row by row, at a fraction of the time and memory.

Row by row, a chat row renders its chat template 1 + 3 x (assistant turns) times through
apply_chat_template, tokenizes alone, labels tokens in a Python loop, and keeps its ids and labels as
Python lists (about 60 bytes a token). Here:

  rendering  SkeletonRenderer: when the template provably puts every message's content into its
             output verbatim (checked on its syntax tree, then by probe renders), a rendering depends
             only on the roles, so each (role sequence, generation prompt) is rendered once with
             probe contents and every row's text is the skeleton joined with its contents. The
             span logic itself is data.assistant_spans, unchanged. Other templates (content trimmed,
             tested or transformed) render row by row, as before.
  tokenizing one tokenizer call per chunk of rows (the fast tokenizer's batch path).
  labels     numpy over each row's token start offsets, truncation included.
  storage    TokenStore: the ids of every row end to end in one int32 array, a one-byte learn mask
             (labels are the ids where it is set, -100 elsewhere) and an int64 start and trained-token
             count per row: about 5 bytes a token. Examples are numpy views made on access.

Rows come from disk in chunks (data.DatasetRows), so memory holds the arrays plus one chunk.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from typing import Any, overload

import numpy as np

from machine.trainer.data import (
    IGNORE,
    DatasetRows,
    Encoded,
    Example,
    Renderer,
    Tokenized,
    assistant_spans,
    chat_template,
    render,
    template_renderer,
)

# Rows per tokenizer call. Measured on 2 busy cores with SmolLM2: 1,000 about 20 % more rows/s than
# 128 or 256, 4,000 no more; a chunk's Python lists are the transient part of the peak memory.
CHUNK_ROWS = 1000

# Tests that say the same of any string content, so they cannot depend on what the content says.
_TYPE_TESTS = frozenset({"string", "defined", "undefined", "none"})


def content_is_verbatim(template: str) -> bool:
    """True when the template's only uses of a message's content are to output it unchanged
    (`{{ ... + message['content'] + ... }}`) or to test it for emptiness or type. Then the text
    between contents depends only on the roles (an emptiness test must change nothing: the all-empty
    probe checks that). Anything else (a filter such as trim, a call, a comparison, an assignment, a
    captured block) may make the text depend on what the content says: False."""
    from jinja2 import Environment, TemplateSyntaxError

    try:
        tree = Environment(extensions=["jinja2.ext.loopcontrols"]).parse(template)
    except TemplateSyntaxError:
        return False  # e.g. a {% generation %} block: only transformers' environment parses it
    return _content_verbatim_in(tree, "other", False)


def _content_verbatim_in(node: Any, context: str, captured: bool) -> bool:
    """Whether every use of a message's content under the template node is written as is ("output") or tested
    ("test"): `context` is how the node's value is used, `captured` whether its output is kept, not written."""
    from jinja2 import nodes

    if _is_content(node):
        return context in ("output", "test")
    if isinstance(node, nodes.Const) and node.value == "content":
        return False  # content read some other way: .get('content'), map(attribute='content'), ...
    # Output inside these is filtered, kept in a variable or passed on, not written as is.
    captured = captured or isinstance(node, (nodes.FilterBlock, nodes.AssignBlock, nodes.CallBlock, nodes.Macro))
    for name, value in node.iter_fields():
        for child in value if isinstance(value, list) else [value]:
            if isinstance(child, nodes.Node) and not _content_verbatim_in(
                    child, _child_context(node, name, context, captured), captured):
                return False
    return True


def _is_content(node: Any) -> bool:
    from jinja2 import nodes

    return ((isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const) and node.arg.value == "content")
            or (isinstance(node, nodes.Getattr) and node.attr == "content"))


def _child_context(node: Any, name: str, context: str, captured: bool) -> str:
    """How the value of the node's field `name` is used, given how the node's own is."""
    from jinja2 import nodes

    if isinstance(node, nodes.Output):
        return "other" if captured else "output"
    if context == "output" and (isinstance(node, (nodes.Add, nodes.Concat))
                                or (isinstance(node, nodes.CondExpr) and name in ("expr1", "expr2"))):
        return "output"
    if isinstance(node, (nodes.If, nodes.CondExpr)) and name == "test":
        return "test"
    if context == "test" and (isinstance(node, (nodes.And, nodes.Or, nodes.Not))
                              or (isinstance(node, nodes.Test) and name == "node" and node.name in _TYPE_TESTS)):
        return "test"
    return "other"


class SkeletonRenderer:
    """data.render for a template with content_is_verbatim, from one probe rendering per (roles,
    add_generation_prompt): the skeleton is the text around each content. A skeleton is used only
    when three probes agree (distinct markers; contents with spaces, newlines, quotes and markup; all
    empty), else that key renders row by row through the template itself."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.template = chat_template(tokenizer)
        self.fast = isinstance(self.template, str) and content_is_verbatim(self.template)
        self.direct = template_renderer(tokenizer)
        self.skeletons: dict[tuple[tuple[str, ...], bool], list[str] | None] = {}

    def __call__(self, messages: list[dict[str, str]], generation: bool) -> str:
        if not self.fast:
            return self.direct(messages, generation)
        key = (tuple(m["role"] for m in messages), generation)
        if key not in self.skeletons:
            self.skeletons[key] = self._probe(*key)
        parts = self.skeletons[key]
        if parts is None:
            return self.direct(messages, generation)
        return _join(parts, [m["content"] for m in messages])

    def _probe(self, roles: tuple[str, ...], generation: bool) -> list[str] | None:
        def draw(contents: list[str]) -> str:
            return render(self.tokenizer, [{"role": r, "content": c} for r, c in zip(roles, contents, strict=True)],
                          add_generation_prompt=generation)

        marks = [f"TENSORANTPROBE{j}Q" for j in range(len(roles))]  # the Q: PROBE1Q is not inside PROBE11Q
        try:
            text = draw(marks)
        except Exception:  # e.g. the template rejects this role order: the direct render will say so
            return None
        parts, at = [], 0
        for mark in marks:
            where = text.find(mark, at)
            if where < 0 or text.count(mark) != 1:
                return None
            parts.append(text[at:where])
            at = where + len(mark)
        parts.append(text[at:])
        for contents in ([f" \n\t<b>TENSORANTPROBE{j}Z</b> \"'&{{% <think>x</think> \n" for j in range(len(roles))],
                         [""] * len(roles)):
            try:
                if draw(contents) != _join(parts, contents):
                    return None
            except Exception:
                return None
        return parts


def _join(parts: list[str], contents: list[str]) -> str:
    out = [parts[0]]
    for content, part in zip(contents, parts[1:], strict=True):
        out += (content, part)
    return "".join(out)


class TokenStore:
    """Encoded rows end to end: int32 ids, a one-byte learn mask; per row an int64 start, a trained
    token count and a truncated flag. Appended to chunk by chunk (array.array grows in place), then frozen into numpy
    views of the same memory."""

    def __init__(self) -> None:
        self._ids = array("i")
        assert self._ids.itemsize == 4, "int32 ids need a 4-byte C int"
        self._learn = array("B")
        self._starts = array("q", [0])
        self._truncated = array("B")
        self._trained = array("q")  # per row, so no per-token count is ever made
        self.ids: np.ndarray = np.zeros(0, dtype=np.int32)
        self.learn: np.ndarray = np.zeros(0, dtype=bool)
        self.starts: np.ndarray = np.zeros(1, dtype=np.int64)
        self.truncated: np.ndarray = np.zeros(0, dtype=bool)
        self.trained: np.ndarray = np.zeros(0, dtype=np.int64)
        self.frozen = False

    def append(self, rows: list[tuple[np.ndarray, np.ndarray, bool]]) -> None:
        assert not self.frozen, "a frozen store's arrays are views of its buffers, which cannot grow"
        if not rows:
            return
        self._ids.frombytes(np.concatenate([ids for ids, _, _ in rows]).astype(np.int32, copy=False).tobytes())
        self._learn.frombytes(np.concatenate([learn for _, learn, _ in rows]).astype(np.uint8).tobytes())
        ends = self._starts[-1] + np.cumsum([len(ids) for ids, _, _ in rows], dtype=np.int64)
        self._starts.frombytes(ends.tobytes())
        self._truncated.frombytes(bytes(bool(t) for _, _, t in rows))
        self._trained.extend(int(np.count_nonzero(learn)) for _, learn, _ in rows)

    def freeze(self) -> TokenStore:
        self.ids = np.frombuffer(self._ids, dtype=np.int32)
        self.learn = np.frombuffer(self._learn, dtype=np.bool_)
        self.starts = np.frombuffer(self._starts, dtype=np.int64)
        self.truncated = np.frombuffer(self._truncated, dtype=np.bool_)
        self.trained = np.frombuffer(self._trained, dtype=np.int64)
        self.frozen = True
        return self

    def __len__(self) -> int:
        return len(self._truncated)

    def row(self, r: int, inputs: bool = False) -> Tokenized:
        """Row r; inputs: every token learned (train_on_inputs), not only the assistant's."""
        a, b = int(self.starts[r]), int(self.starts[r + 1])
        ids = self.ids[a:b]
        if inputs:
            return Tokenized(ids, ids, bool(self.truncated[r]))
        return Tokenized(ids, np.where(self.learn[a:b], ids, np.int32(IGNORE)), bool(self.truncated[r]))

    def select(self, rows: np.ndarray) -> Encoded:
        """These store rows, in this order, as an Encoded: the ones with no trained token dropped."""
        keep = rows[self.trained[rows] > 0]
        return Encoded(StoredExamples(self, keep), truncated=int(self.truncated[rows].sum()),
                       dropped=len(rows) - len(keep))

    def nbytes(self) -> int:
        arrays = (self._ids, self._learn, self._starts, self._truncated, self._trained)
        return sum(a.buffer_info()[1] * a.itemsize for a in arrays)


class StoredExamples(Sequence[Tokenized]):
    """Some of a frozen TokenStore's rows, in a given order, as Tokenized examples made on access."""

    def __init__(self, store: TokenStore, rows: np.ndarray, inputs: bool = False) -> None:
        assert store.frozen
        self.store, self.rows, self.inputs = store, rows, inputs

    def __len__(self) -> int:
        return len(self.rows)

    @overload
    def __getitem__(self, i: int) -> Tokenized: ...

    @overload
    def __getitem__(self, i: slice) -> StoredExamples: ...

    def __getitem__(self, i: int | slice) -> Tokenized | StoredExamples:
        if isinstance(i, slice):
            return StoredExamples(self.store, self.rows[i], self.inputs)
        return self.store.row(int(self.rows[i]), self.inputs)

    def __iter__(self) -> Iterator[Tokenized]:
        for r in self.rows:
            yield self.store.row(int(r), self.inputs)


def with_inputs(encoded: Encoded) -> Encoded:
    """The same rows with every token learned (the train_on_inputs setting): prompts, system turns and
    template markers too. Which rows are kept does not change: a row cut before its first assistant
    token is still dropped, as without it."""
    examples = encoded.examples
    assert isinstance(examples, StoredExamples), "train_on_inputs applies to a batch-encoded split"
    return Encoded(StoredExamples(examples.store, examples.rows, inputs=True), encoded.truncated, encoded.dropped)


class Encoder:
    """Encodes chunks of rows for one tokenizer and max_seq_len (skeletons are kept across chunks)."""

    def __init__(self, tokenizer: Any, max_seq_len: int) -> None:
        self.tokenizer = tokenizer
        self.max_seq_len = max_seq_len
        self.renderer: Renderer = SkeletonRenderer(tokenizer)

    def encode(self, examples: Sequence[Example]) -> list[tuple[np.ndarray, np.ndarray, bool]]:
        """(int32 ids, learn mask, truncated) per example, as data.encode would give them."""
        out: list[tuple[np.ndarray, np.ndarray, bool] | None] = [None] * len(examples)
        chats = [(j, *assistant_spans(self.tokenizer, ex.messages, self.renderer))
                 for j, ex in enumerate(examples) if ex.messages is not None]
        texts = [(j, ex.text) for j, ex in enumerate(examples) if ex.text is not None]
        if chats:
            # The template already holds any special tokens (BOS, turn markers): add none.
            enc = self.tokenizer([text for _, text, _ in chats], add_special_tokens=False,
                                 return_offsets_mapping=True, return_attention_mask=False)
            for (j, _, spans), ids, offsets in zip(chats, enc["input_ids"], enc["offset_mapping"], strict=True):
                starts = np.fromiter((start for start, _ in offsets), dtype=np.int64, count=len(offsets))
                out[j] = self._chat_row(np.asarray(ids, dtype=np.int32), starts, spans)
        if texts:
            enc = self.tokenizer([text for _, text in texts], add_special_tokens=True, return_attention_mask=False)
            for (j, _), ids in zip(texts, enc["input_ids"], strict=True):
                row = np.asarray(ids, dtype=np.int32)
                out[j] = (row[: self.max_seq_len], np.ones(min(len(row), self.max_seq_len), dtype=bool),
                          len(row) > self.max_seq_len)
        assert all(r is not None for r in out)
        return out  # type: ignore[return-value]  # every slot filled above

    def _chat_row(self, ids: np.ndarray, starts: np.ndarray,
                  spans: list[tuple[int, int, int]]) -> tuple[np.ndarray, np.ndarray, bool]:
        """data.encode's labelling and truncation over token start offsets."""
        limit = self.max_seq_len
        turn = np.full(len(ids), -1, dtype=np.int64)  # per token: its assistant span, or -1
        # A token belongs to the first span its first character is in: assign the last span first.
        for k in range(len(spans) - 1, -1, -1):
            start, _stop, end = spans[k]
            turn[(starts >= start) & (starts < end)] = k
        learn = turn >= 0
        if len(ids) <= limit:
            return ids, learn, False
        k = int(turn[limit])  # the turn the cut falls in
        if k >= 0:
            ends = np.flatnonzero((turn == k) & (starts >= spans[k][1]))  # its end-of-turn marker
            cut = limit - len(ends)
            # Only when some of the answer stays: an end marker alone would teach an empty answer.
            if len(ends) and cut > int(np.argmax(turn == k)):
                keep = np.concatenate([np.arange(cut), ends])
                return ids[keep], learn[keep], True
        return ids[:limit], learn[:limit], True


def _chunks(rows: Iterable[Example], size: int) -> Iterator[list[Example]]:
    it = iter(rows)
    while chunk := list(islice(it, size)):
        yield chunk


def encode_splits(tokenizer: Any, rows: DatasetRows, splits: Sequence[Sequence[int]],
                  max_seq_len: int) -> list[Encoded]:
    """One Encoded per split (row indices, e.g. lora.split's train and held-out), its examples in the
    split's order, each row read from disk and encoded once; rows in no split are not encoded."""
    indices = [np.asarray(s, dtype=np.int64) for s in splits]
    wanted = np.zeros(len(rows), dtype=bool)
    for s in indices:
        wanted[s] = True
    encoder, store = Encoder(tokenizer, max_seq_len), TokenStore()
    for chunk in _chunks((ex for _, ex in rows.read(wanted)), CHUNK_ROWS):
        store.append(encoder.encode(chunk))
    store.freeze()
    # The store holds the wanted rows in file order: a row's place there is its rank among them.
    place = np.cumsum(wanted, dtype=np.int64) - 1
    return [store.select(place[s]) for s in indices]
