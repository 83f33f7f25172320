"""A model directory with random weights at a declared base model's shapes, and a local tokenizer.

No hub access: the tokenizer is a byte-level BPE trained here with `tokenizers` on a small
corpus, with a ChatML chat template, and the weights are random-initialised from the
architecture's config (adapter_format.base_models). Used by the CPU trainer tests, the GPU
check (real dimensions, random weights) and the trainer benchmark.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from adapter_format.base_models import DeclaredModel, get_base_model

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A LoRA adapter trains two small matrices per layer while the base model stays frozen.",
    "What is the capital of France? The capital of France is Paris.",
    "Translate to pirate speech: hello friend. Ahoy matey!",
    "user assistant system question answer because therefore however",
    "0 1 2 3 4 5 6 7 8 9 10 100 1000 + - * / = ( ) [ ] { } , . ; : ! ?",
]


def build_tokenizer(vocab_size: int, corpus: Iterable[str] = ()) -> Any:
    """A transformers fast tokenizer: byte-level BPE with ChatML special tokens and template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(list(corpus) + _CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, unk_token=None)
    fast.chat_template = CHATML
    return fast


def declared(base_model: str) -> DeclaredModel:
    model = get_base_model(base_model)
    if model is None:
        raise ValueError(f"base model {base_model!r} is not declared in adapter_format.base_models")
    return model


def build_random_model(base_model: str, out_dir: str | Path, *, seed: int = 0, dtype: str = "float32",
                       device: str = "cpu", corpus: Iterable[str] = (), vocab_size: int | None = None) -> Path:
    """Write config, random weights and a tokenizer for `base_model`'s shapes into out_dir.

    vocab_size: the tokenizer's (at most the model's, which keeps the declared size so shapes and
    memory are real); default min(model vocab, 512)."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    spec = declared(base_model)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(min(vocab_size or 512, spec.vocab_size), corpus)
    config = spec.hf_config()
    config.eos_token_id = tokenizer.eos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    config.bos_token_id = None
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    del model
    return out
