"""The training loss without the full logits: chunked cross-entropy over the final hidden states.

A causal LM's forward returns logits for every position, batch x seq x vocab: at a 150k
vocabulary that is 600 kB per token in fp32 (plus the fp32 copy, log-softmax and gradient the
loss keeps for backward), which is what dominates memory for small models. Here the decoder runs
without its head; only the positions that are learned (label != -100, after the one-token shift)
are kept, and lm_head + cross-entropy run on CHUNK_ELEMENTS / vocab of them at a time, each chunk
but the last under activation checkpointing: its logits are freed after the forward and recomputed
during backward, so one chunk's logits are alive at any moment. The last chunk's are kept instead:
its backward runs first, before any other chunk is recomputed, so keeping them adds nothing to the
peak and saves one lm_head pass over that chunk (all of it when a micro-batch fits in one chunk).
Prompt and padding positions never go through lm_head at all. The result is the summed token
loss; callers divide by their token count.

Used for the architectures whose head is a plain linear layer (CHUNKED); any other model falls
back to its own forward (`.loss`, a mean, times the token count).
"""

from __future__ import annotations

from typing import Any

from adapter_format.base_models import LOSS_CHUNK_ELEMENTS as CHUNK_ELEMENTS
from machine.trainer.data import IGNORE

# CHUNK_ELEMENTS, logits elements per chunk: 2**25 fp32 = 128 MiB (plus as much for the gradient)
# whatever the vocabulary; declared with the memory table, whose logits term it sets.
# model types whose logits are exactly lm_head(final hidden state) (no soft-capping or scaling)
CHUNKED = frozenset({"llama", "mistral", "qwen2", "qwen3"})


def chunk_tokens(vocab_size: int) -> int:
    return max(1, CHUNK_ELEMENTS // vocab_size)


def _chunk_loss(head: Any, hidden: Any, targets: Any) -> Any:
    import torch

    # fp32 logits for the loss, as transformers' own loss does (bf16 log-softmax loses precision).
    return torch.nn.functional.cross_entropy(head(hidden).float(), targets, reduction="sum")


def chunked_loss_sum(head: Any, hidden: Any, labels: Any, chunk: int) -> Any:
    """Sum of next-token cross-entropy over positions whose shifted label is not -100.

    hidden: [batch, seq, dim] final hidden states; labels: [batch, seq] (unshifted, like HF's)."""
    import torch
    from torch.utils.checkpoint import checkpoint

    targets = labels[:, 1:]
    keep = targets != IGNORE
    h = hidden[:, :-1][keep]  # [n, dim]: only the learned positions reach the head
    t = targets[keep]
    total = h.new_zeros((), dtype=torch.float32)
    for i in range(0, t.shape[0], chunk):
        last = i + chunk >= t.shape[0]
        if torch.is_grad_enabled() and h.requires_grad and not last:
            total = total + checkpoint(_chunk_loss, head, h[i: i + chunk], t[i: i + chunk], use_reentrant=False)
        else:
            total = total + _chunk_loss(head, h[i: i + chunk], t[i: i + chunk])
    return total


def loss_sum(model: Any, inputs: dict[str, Any], n_tokens: int) -> Any:
    """The summed token loss of one collated micro-batch (n_tokens: its learned token count)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # under peft
    if base.config.model_type not in CHUNKED:
        return model(**inputs).loss * n_tokens
    decoder, head = base.get_decoder(), base.get_output_embeddings()
    # example_starts (packed rows) reaches the attention function as a keyword (batches.segment_attention).
    extra = {"example_starts": inputs["example_starts"]} if "example_starts" in inputs else {}
    out = decoder(input_ids=inputs["input_ids"], attention_mask=inputs.get("attention_mask"),
                  position_ids=inputs.get("position_ids"), use_cache=False, **extra)
    return chunked_loss_sum(head, out.last_hidden_state, inputs["labels"], chunk_tokens(head.weight.shape[0]))
