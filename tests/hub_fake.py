"""A Hugging Face hub on loopback (hand-written: no emulator of the hub's HTTP API exists), serving what the
control plane reads of a base model: `/{id}/resolve/{rev}/config.json`, `model.safetensors.index.json` or
`model.safetensors` (its header, by Range), and `/api/models/{id}/revision/{rev}` (a branch's commit id).

CONFIGS hold the shape fields of each model's published config.json (the values on the hub's model pages,
nothing else of the file). A gated model answers 401 without a token and 403 with a token it does not know.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def sha_of(model_id: str, branch: str = "main") -> str:
    return hashlib.sha1(f"{model_id}@{branch}".encode()).hexdigest()


CONFIGS: dict[str, dict[str, Any]] = {
    "meta-llama/Llama-3.2-1B": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
        "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 64, "vocab_size": 128256, "tie_word_embeddings": True, "max_position_embeddings": 131072,
        "rope_theta": 500000.0, "rms_norm_eps": 1e-05, "attention_bias": False, "torch_dtype": "bfloat16"},
    "Qwen/Qwen2.5-0.5B": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896,
        "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
        "vocab_size": 151936, "tie_word_embeddings": True, "max_position_embeddings": 32768,
        "rope_theta": 1000000.0, "rms_norm_eps": 1e-06, "torch_dtype": "bfloat16"},
    "Qwen/Qwen3-0.6B": {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024,
        "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
        "head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": True, "max_position_embeddings": 40960,
        "rope_theta": 1000000, "rms_norm_eps": 1e-06, "attention_bias": False, "torch_dtype": "bfloat16"},
    "mistralai/Mistral-7B-v0.3": {
        "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 128, "vocab_size": 32768, "tie_word_embeddings": False, "max_position_embeddings": 32768,
        "rope_theta": 1000000.0, "rms_norm_eps": 1e-05, "torch_dtype": "bfloat16"},
    "google/gemma-2-2b": {
        "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "hidden_size": 2304,
        "intermediate_size": 9216, "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
        "head_dim": 256, "vocab_size": 256000, "max_position_embeddings": 8192, "rope_theta": 10000.0,
        "rms_norm_eps": 1e-06, "torch_dtype": "float32"},
    "google/gemma-3-1b-it": {
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 1152,
        "intermediate_size": 6912, "num_hidden_layers": 26, "num_attention_heads": 4, "num_key_value_heads": 1,
        "head_dim": 256, "vocab_size": 262144, "max_position_embeddings": 32768, "rope_theta": 1000000,
        "rms_norm_eps": 1e-06, "torch_dtype": "bfloat16"},
    "microsoft/Phi-3-mini-4k-instruct": {
        "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_size": 3072,
        "intermediate_size": 8192, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
        "vocab_size": 32064, "tie_word_embeddings": False, "max_position_embeddings": 4096, "rope_theta": 10000.0,
        "rms_norm_eps": 1e-05, "torch_dtype": "bfloat16"},
    "HuggingFaceTB/SmolLM2-135M-Instruct": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576,
        "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
        "head_dim": 64, "vocab_size": 49152, "tie_word_embeddings": True, "max_position_embeddings": 8192,
        "rope_theta": 100000, "rms_norm_eps": 1e-05, "torch_dtype": "bfloat16"},
}
# Published parameter counts (the safetensors index's total_size / 2 for bf16, or the single file's tensors).
PARAMS = {"meta-llama/Llama-3.2-1B": 1_235_814_400, "Qwen/Qwen2.5-0.5B": 494_032_768,
          "Qwen/Qwen3-0.6B": 596_049_920, "mistralai/Mistral-7B-v0.3": 7_248_023_552,
          "google/gemma-2-2b": 2_614_341_888, "google/gemma-3-1b-it": 999_885_952,
          "microsoft/Phi-3-mini-4k-instruct": 3_821_079_552, "HuggingFaceTB/SmolLM2-135M-Instruct": 134_515_008}
# Sharded checkpoints (an index); the others are one model.safetensors (read by its header).
SHARDED = {"mistralai/Mistral-7B-v0.3", "google/gemma-2-2b", "microsoft/Phi-3-mini-4k-instruct"}


def safetensors_header(params: int) -> bytes:
    """A safetensors file's first bytes: the length and a header whose tensors hold `params` elements."""
    header = json.dumps({"__metadata__": {"format": "pt"},
                         "model.embed_tokens.weight": {"dtype": "BF16", "shape": [params], "data_offsets": [0, 2 * params]}})
    return struct.pack("<Q", len(header)) + header.encode()


@dataclass
class FakeHub:
    url: str = ""
    configs: dict[str, dict[str, Any]] = field(default_factory=lambda: {k: dict(v) for k, v in CONFIGS.items()})
    params: dict[str, int] = field(default_factory=lambda: dict(PARAMS))
    gated: dict[str, str] = field(default_factory=dict)  # model id -> the one token that may read it
    requests: list[tuple[str, str]] = field(default_factory=list)  # (path, authorization)
    delay_s: float = 0.0  # a slow hub: each answer waits this long

    def count(self, fragment: str) -> int:
        return sum(1 for path, _ in self.requests if fragment in path)

    def _answer(self, path: str, auth: str, range_header: str) -> tuple[int, bytes]:
        revision = re.fullmatch(r"/api/models/(.+)/revision/([^/]+)", path)
        resolve = re.fullmatch(r"/(.+?/.+?)/resolve/([^/]+)/(.+)", path)
        model_id = revision.group(1) if revision else resolve.group(1) if resolve else ""
        if model_id not in self.configs:
            return 404, b'{"error": "Repository not found"}'
        if model_id in self.gated:
            if not auth:
                return 401, b'{"error": "Access to model is restricted"}'
            if auth != f"Bearer {self.gated[model_id]}":
                return 403, b'{"error": "Access to model is restricted, you are not in the authorized list"}'
        if revision:
            branch = revision.group(2)
            if branch not in ("main", "v1"):
                return 404, b'{"error": "Invalid rev id"}'
            return 200, json.dumps({"id": model_id, "sha": sha_of(model_id, branch)}).encode()
        assert resolve is not None
        rev, name = resolve.group(2), resolve.group(3)
        if rev not in (sha_of(model_id), sha_of(model_id, "v1"), "main"):
            return 404, b'{"error": "Revision not found"}'
        if name == "config.json":
            return 200, json.dumps(self.configs[model_id]).encode()
        sharded = model_id in SHARDED
        if name == "model.safetensors.index.json" and sharded:
            dtype = self.configs[model_id].get("torch_dtype", "bfloat16")
            width = 4 if dtype == "float32" else 2
            return 200, json.dumps({"metadata": {"total_size": width * self.params[model_id]},
                                    "weight_map": {}}).encode()
        if name == "model.safetensors" and not sharded:
            data = safetensors_header(self.params[model_id])
            got = re.fullmatch(r"bytes=(\d+)-(\d+)", range_header)
            if got:
                return 206, data[int(got.group(1)):int(got.group(2)) + 1]
            return 200, data
        return 404, b'{"error": "Entry not found"}'


@contextmanager
def fake_hub() -> Iterator[FakeHub]:
    hub = FakeHub()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            auth = self.headers.get("Authorization", "")
            hub.requests.append((self.path, auth))
            status, body = hub._answer(self.path, auth, self.headers.get("Range", ""))
            if hub.delay_s:
                time.sleep(hub.delay_s)
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
