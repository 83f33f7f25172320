"""Declared base models: full decoder shapes, parameter counts, and GPU memory for a LoRA run.

The verifier checks every lora_A [r, in] / lora_B [out, r] pair against `modules` of the
model the run names; the control plane lists these models (GET /api/base-models) and
checks that an offer's GPU can hold a run (`estimate_memory`). A base model that is not
declared here is still accepted by the verifier; only its in/out sizes and layer count go
unchecked (the verifier says so in its summary).

Shapes are those of the published config.json of each model; tests/trainer/test_base_models.py
builds each architecture on the meta device and compares parameter counts.

GPU memory of a LoRA run, derived from the tensors the trainer holds (bytes; each term is the
dtype the loaded model, peft and the trainer give it; tests/trainer/test_base_models.py builds each
model on the meta device, applies the same casts and checks the weights and LoRA terms exactly):

  weights      bf16: 2 x params. 4-bit (bitsandbytes NF4, double quant): the decoder layers'
               linear weights at 4.127 bits each (absmax constants included); every other tensor
               (embeddings, lm_head, norms, biases) is cast to fp32 by peft's
               prepare_model_for_kbit_training: 4 bytes each. For Llama-3.1-8B that is 4.2 GB of
               fp32 embeddings and head beside 3.6 GB of 4-bit layers.
  LoRA         r x (in + out) per adapted module per layer, kept in fp32 by peft: weight 4 + grad 4 +
               AdamW moments 8 = 16 bytes per trainable parameter.
  activations  gradient checkpointing keeps each layer's input, b x s x hidden x layers in the residual
               stream's dtype (bf16: 2 bytes; 4-bit: 4, since the fp32 embeddings make it fp32), plus
               one layer recomputed at a time, b x s x (6 x hidden + 2 x q_dim + 2 x kv_dim + 4 x
               intermediate) x 2 bytes (SDPA attention: no s x s score matrix is stored).
               Without checkpointing every layer keeps that working set.
  logits       the trainer never holds the full b x s x vocab logits (machine/trainer/loss.py): lm_head
               and the cross-entropy run on LOSS_CHUNK_ELEMENTS / vocab learned tokens at a time,
               recomputed in backward, so one chunk is alive: min(b x s, chunk) x vocab x 12 bytes
               (logits, their fp32 log-softmax and gradient), at most 2**25 x 12 = 384 MiB.

`peak_allocated` is their sum: what torch.cuda.max_memory_allocated should report
(tests/gpu/check_training.py prints the measured peak against it). `estimate_memory`, what an
offer's GPU must have, adds the margin: ALLOCATOR_MARGIN (10 %: the caching allocator reserves more
than it hands out) and CUDA_CONTEXT (0.75 GiB: the CUDA context and cuBLAS workspace, which
max_memory_allocated does not count). Llama-3.1-8B LoRA at batch 2 x 512 tokens: 16.0 GiB
allocated (torchtune publishes a 16.2 GiB peak for its single-device LoRA recipe); at the default
4 x 1024 17.2 GiB allocated, 19.7 GiB needed. QLoRA at 4 x 1024: 10.6 GiB allocated, 12.4 needed.

A merged model (training.merged, machine/trainer/merge.py) is built after the training model is freed:
the base weights in bf16 again (the `weights` term of an unquantized run, so the table covers it) plus
one adapted module's B @ A at a time; a 4-bit run merges on the CPU (2 bytes a parameter of host RAM).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Architecture = Literal["llama", "qwen2", "mistral", "qwen3", "gemma2", "gemma3", "phi3"]
GiB = 1024**3
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
ALL_LINEAR = ATTENTION + MLP
# Phi-3 fuses q/k/v into qkv_proj and gate/up into gate_up_proj.
FUSED_ATTENTION = ("qkv_proj", "o_proj")
FUSED_ALL_LINEAR = (*FUSED_ATTENTION, "gate_up_proj", "down_proj")
# Logits elements per chunk of the trainer's chunked cross-entropy (machine/trainer/loss.py uses this).
LOSS_CHUNK_ELEMENTS = 2**25
_NF4_BITS = 4.127  # 4 bits + fp8 absmax per 64 + fp32 per 256 blocks (double quantization)
ALLOCATOR_MARGIN = 1.10  # reserved over allocated: the caching allocator's fragmentation
CUDA_CONTEXT = 3 * GiB // 4  # CUDA context + cuBLAS workspace, outside max_memory_allocated
# training.merged (adapter_format.merged): one presigned PUT uploads the merged archive (S3 takes at most
# 5 GiB in one) and one verify-adapter invocation downloads and reads it whole (measured: 484 MB/s of one
# core here, so 3 GiB is ~7 s of CPU; the download dominates: ~64 s at 50 MB/s, inside the step's 100 s),
# so it holds at most this much: up to about 1.5B parameters in bf16, Llama-3.2-1B (2.5 GB) the largest
# declared. Larger declared models are refused at create (merged_bytes).
MAX_MERGED_BYTES = 3 * GiB


@dataclass(frozen=True)
class DeclaredModel:
    name: str
    architecture: Architecture
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_embeddings: bool
    attention_bias: bool = False  # Qwen2: q/k/v carry a bias
    rope_theta: float = 10000.0
    max_position: int = 4096
    rms_norm_eps: float = 1e-5
    default_targets: tuple[str, ...] = ATTENTION
    note: str = ""
    # The parameter count the checkpoint itself declares (a Hub model's safetensors index or header); 0: derived
    # from the shapes. Gemma's extra norms and Qwen3's q/k norms are counted by it, not by param_count's formula.
    params: int = 0

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def modules(self) -> dict[str, tuple[int, int]]:
        """LoRA-targetable linear module name -> (in_features, out_features), per layer."""
        h, q, kv, i = self.hidden_size, self.q_dim, self.kv_dim, self.intermediate_size
        if self.architecture == "phi3":
            return {"qkv_proj": (h, q + 2 * kv), "o_proj": (q, h), "gate_up_proj": (h, 2 * i), "down_proj": (i, h)}
        return {
            "q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h),
        }

    def layer_linear_params(self) -> int:
        """Weights of the linear layers of one decoder layer (what 4-bit quantizes)."""
        return sum(n_in * n_out for n_in, n_out in self.modules.values())

    def param_count(self) -> int:
        if self.params:
            return self.params
        per_layer = self.layer_linear_params() + 2 * self.hidden_size  # + two RMSNorms
        if self.attention_bias:
            per_layer += self.q_dim + 2 * self.kv_dim
        embeddings = self.vocab_size * self.hidden_size
        head = 0 if self.tie_embeddings else embeddings
        return self.num_layers * per_layer + embeddings + head + self.hidden_size  # + final norm

    def lora_params(self, r: int, targets: tuple[str, ...] | list[str]) -> int:
        mods = self.modules
        return self.num_layers * sum(r * (mods[t][0] + mods[t][1]) for t in targets)

    def targets(self, target_modules: str) -> tuple[str, ...]:
        """The module names of a TENSORANT_TRAINING target_modules value."""
        fused = self.architecture == "phi3"
        if target_modules == "all-linear":
            return FUSED_ALL_LINEAR if fused else ALL_LINEAR
        if target_modules == "attention":
            return FUSED_ATTENTION if fused else ATTENTION
        raise ValueError(f"target_modules must be 'attention' or 'all-linear', not {target_modules!r}")

    def hf_config(self) -> Any:
        """The transformers config of this architecture (imports transformers)."""
        import transformers

        common: dict[str, Any] = dict(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_layers, num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads, head_dim=self.head_dim,
            max_position_embeddings=self.max_position, rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta, tie_word_embeddings=self.tie_embeddings,
        )
        if self.architecture == "llama":
            return transformers.LlamaConfig(attention_bias=self.attention_bias, mlp_bias=False, **common)
        if self.architecture == "qwen2":
            return transformers.Qwen2Config(**common)
        if self.architecture != "mistral":
            raise ValueError(f"no transformers config is built here for {self.architecture}")
        return transformers.MistralConfig(sliding_window=None, **common)

    def weight_bytes(self, load_in_4bit: bool = False) -> int:
        """The base model's weights as the trainer holds them (module docstring: weights)."""
        if not load_in_4bit:
            return self.param_count() * 2
        linear = self.num_layers * self.layer_linear_params()
        return int(linear * _NF4_BITS / 8) + (self.param_count() - linear) * 4

    def peak_allocated(self, *, batch_size: int = 4, seq_len: int = 1024, lora_r: int = 16,
                       target_modules: str = "attention", load_in_4bit: bool = False,
                       gradient_checkpointing: bool = True) -> int:
        """Peak bytes torch allocates during a LoRA run at these settings (module docstring)."""
        lora = self.lora_params(lora_r, self.targets(target_modules)) * 16
        tokens = batch_size * seq_len
        working = tokens * (6 * self.hidden_size + 2 * self.q_dim + 2 * self.kv_dim + 4 * self.intermediate_size) * 2
        residual = 4 if load_in_4bit else 2
        if gradient_checkpointing:
            activations = tokens * self.hidden_size * residual * self.num_layers + working
        else:
            activations = working * self.num_layers
        logits = min(tokens, max(1, LOSS_CHUNK_ELEMENTS // self.vocab_size)) * self.vocab_size * 12
        return self.weight_bytes(load_in_4bit) + lora + activations + logits

    def estimate_memory(self, **settings: Any) -> int:
        """GPU bytes an offer must have for a LoRA run at these settings (peak_allocated's
        keywords): the peak allocation with the allocator's margin and the CUDA context."""
        return int(self.peak_allocated(**settings) * ALLOCATOR_MARGIN) + CUDA_CONTEXT

    def merged_bytes(self) -> int:
        """The merged weights in bf16, the declared checkpoints' dtype (the archive adds a few kB)."""
        return self.param_count() * 2

    def describe(self, **settings: Any) -> dict[str, Any]:
        """A JSON-ready summary for listings (GET /api/base-models)."""
        return {
            "name": self.name, "architecture": self.architecture, "hidden_size": self.hidden_size,
            "num_layers": self.num_layers, "num_heads": self.num_heads, "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim, "q_dim": self.q_dim, "kv_dim": self.kv_dim,
            "intermediate_size": self.intermediate_size, "vocab_size": self.vocab_size,
            "tie_embeddings": self.tie_embeddings, "params": self.param_count(),
            "memory_gb_bf16": round(self.estimate_memory(**settings) / GiB, 1),
            "memory_gb_4bit": round(self.estimate_memory(load_in_4bit=True, **settings) / GiB, 1),
            "note": self.note,
        }


_MODELS = [
    # Exists so the smoke trainer and the verifier have shapes to check; no weights anywhere.
    DeclaredModel("tensorant/smoke-tiny", "llama", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=4,
              head_dim=16, intermediate_size=128, vocab_size=512, tie_embeddings=True,
              default_targets=("q_proj", "v_proj"), note="smoke tests only (no weights)"),
    # Tiny random-initialised models of real architectures for the CPU trainer tests. tiny-llama has
    # heads x head_dim (4 x 32 = 128) != hidden (64), so q/o shapes differ from hidden x hidden.
    DeclaredModel("tensorant/tiny-llama", "llama", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
              head_dim=32, intermediate_size=128, vocab_size=512, tie_embeddings=True,
              note="random weights, built locally for tests"),
    DeclaredModel("tensorant/tiny-qwen2", "qwen2", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
              head_dim=16, intermediate_size=128, vocab_size=512, tie_embeddings=True, attention_bias=True,
              note="random weights, built locally for tests"),
    DeclaredModel("HuggingFaceTB/SmolLM2-135M-Instruct", "llama", hidden_size=576, num_layers=30, num_heads=9,
              num_kv_heads=3, head_dim=64, intermediate_size=1536, vocab_size=49152, tie_embeddings=True,
              rope_theta=100000.0, max_position=8192),
    DeclaredModel("Qwen/Qwen2.5-0.5B-Instruct", "qwen2", hidden_size=896, num_layers=24, num_heads=14,
              num_kv_heads=2, head_dim=64, intermediate_size=4864, vocab_size=151936, tie_embeddings=True,
              attention_bias=True, rope_theta=1000000.0, max_position=32768, rms_norm_eps=1e-6),
    DeclaredModel("Qwen/Qwen2.5-0.5B", "qwen2", hidden_size=896, num_layers=24, num_heads=14,
              num_kv_heads=2, head_dim=64, intermediate_size=4864, vocab_size=151936, tie_embeddings=True,
              attention_bias=True, rope_theta=1000000.0, max_position=32768, rms_norm_eps=1e-6),
    DeclaredModel("Qwen/Qwen2.5-7B-Instruct", "qwen2", hidden_size=3584, num_layers=28, num_heads=28,
              num_kv_heads=4, head_dim=128, intermediate_size=18944, vocab_size=152064, tie_embeddings=False,
              attention_bias=True, rope_theta=1000000.0, max_position=32768, rms_norm_eps=1e-6),
    DeclaredModel("meta-llama/Llama-3.2-1B", "llama", hidden_size=2048, num_layers=16, num_heads=32,
              num_kv_heads=8, head_dim=64, intermediate_size=8192, vocab_size=128256, tie_embeddings=True,
              rope_theta=500000.0, max_position=131072, note="gated on the Hugging Face hub: needs a token"),
    DeclaredModel("meta-llama/Llama-3.1-8B-Instruct", "llama", hidden_size=4096, num_layers=32, num_heads=32,
              num_kv_heads=8, head_dim=128, intermediate_size=14336, vocab_size=128256, tie_embeddings=False,
              rope_theta=500000.0, max_position=131072, note="gated on the Hugging Face hub: needs a token"),
    DeclaredModel("mistralai/Mistral-7B-Instruct-v0.3", "mistral", hidden_size=4096, num_layers=32, num_heads=32,
              num_kv_heads=8, head_dim=128, intermediate_size=14336, vocab_size=32768, tie_embeddings=False,
              rope_theta=1000000.0, max_position=32768),
    DeclaredModel("mistralai/Mistral-7B-v0.1", "mistral", hidden_size=4096, num_layers=32, num_heads=32,
              num_kv_heads=8, head_dim=128, intermediate_size=14336, vocab_size=32000, tie_embeddings=False,
              max_position=32768),
]
BASE_MODELS: dict[str, DeclaredModel] = {m.name: m for m in _MODELS}


def get_base_model(name: str) -> DeclaredModel | None:
    return BASE_MODELS.get(name)
