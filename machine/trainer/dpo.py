"""Direct preference optimization (training.method dpo) on LoRA: the policy is the model with its
adapter, the reference is the same model with the adapter disabled (peft's disable_adapter), so no
second copy of the base weights is held.

A pair's two sequences (prompt + chosen, prompt + rejected) are encoded as SFT rows are
(machine.trainer.data.encode: the chat template, the end-of-turn marker learned), then only the final
answer's tokens keep their labels: the log-probability of a sequence is the sum over those tokens.
The sigmoid loss is the DPO paper's, -log sigmoid(beta * ((pc - rc) - (pr - rr))) (p: policy,
r: reference, c/r: chosen/rejected); ipo is (h - 1 / (2 beta))^2 on the same difference of per-token
mean log-probabilities (IPO, Azar et al. 2023, as TRL computes it). The reward of an answer is
beta * (policy - reference) log-probability; preference accuracy is the share of pairs whose chosen
answer has the higher reward, the reward margin the mean difference.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from machine.trainer.batches import collate_padded
from machine.trainer.data import IGNORE, Example, Tokenized, encode
from machine.trainer.loss import CHUNKED


@dataclass
class Pair:
    """One encoded preference pair; `input_ids` (both sequences' lengths) lets the batch stream and
    the eval order sort pairs as they sort examples."""

    chosen: Tokenized
    rejected: Tokenized
    truncated: bool = False

    @property
    def input_ids(self) -> range:
        return range(len(self.chosen.input_ids) + len(self.rejected.input_ids))

    @property
    def tokens(self) -> int:
        return len(self.chosen.input_ids) + len(self.rejected.input_ids)


@dataclass
class EncodedPairs:
    examples: list[Pair]
    truncated: int = 0
    dropped: int = 0  # pairs where either answer had no token left within max_seq_len


@dataclass(frozen=True)
class Metrics:
    loss: float
    accuracy: float
    margin: float


def _last_answer_only(t: Tokenized) -> Tokenized:
    """The labels of the final assistant turn only (earlier assistant turns of the prompt are context)."""
    labels = list(t.labels)
    end = len(labels)
    while end > 0 and labels[end - 1] == IGNORE:
        end -= 1
    start = end
    while start > 0 and labels[start - 1] != IGNORE:
        start -= 1
    return Tokenized(list(t.input_ids), [IGNORE] * start + labels[start:end] + [IGNORE] * (len(labels) - end),
                     t.truncated)


def encode_pair(tokenizer: Any, example: Example, max_seq_len: int) -> Pair:
    if example.chosen is None or example.rejected is None or example.messages is None:
        raise ValueError("not a preference pair")
    sides = [_last_answer_only(encode(tokenizer, Example(messages=[*example.messages,
                                                                    {"role": "assistant", "content": answer}]),
                                      max_seq_len)) for answer in (example.chosen, example.rejected)]
    return Pair(sides[0], sides[1], sides[0].truncated or sides[1].truncated)


def encode_pairs(tokenizer: Any, examples: Iterable[Example], max_seq_len: int) -> EncodedPairs:
    out = EncodedPairs([])
    for example in examples:
        pair = encode_pair(tokenizer, example, max_seq_len)
        out.truncated += pair.truncated
        if pair.chosen.trained_tokens == 0 or pair.rejected.trained_tokens == 0:
            out.dropped += 1
        else:
            out.examples.append(pair)
    return out


def sequence_logps(model: Any, inputs: dict[str, Any], mean: bool) -> Any:
    """Per row: the sum (or the per-token mean) of the log-probabilities of the labelled tokens.

    For the architectures whose head is a plain linear layer (machine.trainer.loss.CHUNKED) only the
    answers' positions go through lm_head (no batch x seq x vocab logits, as the SFT loss); any other
    model through its own forward."""
    import torch
    import torch.nn.functional as F

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if base.config.model_type in CHUNKED:
        labels = inputs["labels"][:, 1:]
        keep = labels != IGNORE
        hidden = base.get_decoder()(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                                    use_cache=False).last_hidden_state
        token = -F.cross_entropy(base.get_output_embeddings()(hidden[:, :-1][keep]).float(), labels[keep],
                                 reduction="none")
        total = torch.zeros(labels.shape[0], dtype=token.dtype, device=token.device)
        total = total.index_add(0, keep.nonzero()[:, 0], token)
        return total / keep.sum(-1).clamp(min=1) if mean else total
    return full_sequence_logps(model, inputs, mean)


def full_sequence_logps(model: Any, inputs: dict[str, Any], mean: bool) -> Any:
    """sequence_logps from the model's full logits (any architecture; the reference the other is tested against)."""
    import torch

    logits = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], use_cache=False).logits
    labels = inputs["labels"][:, 1:]
    keep = labels != IGNORE
    logps = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    picked = torch.gather(logps, 2, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1) * keep
    total = picked.sum(-1)
    return total / keep.sum(-1).clamp(min=1) if mean else total


def pair_losses(model: Any, batch: Sequence[Pair], pad_id: int, device: Any, beta: float, kind: str
                ) -> tuple[Any, Any, Any]:
    """(loss per pair, chosen reward, rejected reward) for one micro-batch of pairs: chosen and
    rejected sequences in one padded forward, the reference's under disable_adapter without a graph."""
    import torch
    import torch.nn.functional as F

    inputs = collate_padded([p.chosen for p in batch] + [p.rejected for p in batch], pad_id, device)
    mean = kind == "ipo"
    n = len(batch)
    policy = sequence_logps(model, inputs, mean)
    with torch.no_grad(), model.disable_adapter():
        reference = sequence_logps(model, inputs, mean)
    pc, pr, rc, rr = policy[:n], policy[n:], reference[:n], reference[n:]
    h = (pc - rc) - (pr - rr)
    losses = (h - 1 / (2 * beta)) ** 2 if kind == "ipo" else -F.logsigmoid(beta * h)
    return losses, (beta * (pc - rc)).detach(), (beta * (pr - rr)).detach()


def evaluate(model: Any, pairs: Sequence[Pair], batch_size: int, pad_id: int, device: Any, beta: float,
             kind: str) -> Metrics | None:
    import torch

    if not pairs:
        return None
    model.eval()
    loss = acc = margin = 0.0
    with torch.inference_mode():
        for i in range(0, len(pairs), batch_size):
            losses, chosen, rejected = pair_losses(model, pairs[i: i + batch_size], pad_id, device, beta, kind)
            loss += float(losses.sum())
            acc += float((chosen > rejected).float().sum())
            margin += float((chosen - rejected).sum())
    model.train()
    n = len(pairs)
    return Metrics(loss / n, acc / n, margin / n)
