"""Strict verification of a merged model archive (training.merged: the adapter folded into its base
model's weights, machine/trainer/merge.py), with the adapter's discipline (adapter_format.verify):
checksum -> safe unzip (bounded entries, names, sizes, ratio; only the merged model's own files) ->
config.json against the declared architecture -> every safetensors header parsed within bounds, each
shard's data covered exactly -> the tensors, over all shards, exactly the base model's (names and
shapes from adapter_format.base_models, no tensor missing, extra or twice) in one float dtype -> the
index's weight map -> every value finite -> the manifest's sha256 of each file. Nothing is extracted
to disk; each shard is streamed in bounded chunks.

A base model must be declared: without its shapes there is nothing to check the tensors against.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, BinaryIO

from adapter_format.base_models import MAX_MERGED_BYTES, DeclaredModel, get_base_model
from adapter_format.verify import (
    MAX_ENTRIES,
    MAX_PROBLEMS,
    MAX_RATIO,
    Layout,
    VerifyResult,
    _Archive,
    _brief,
    _check_finite,
    _check_listed,
    _load_json,
    _parse_safetensors,
    _refuse,
    _safe_unzip,
    _sha256_of,
    _Stop,
    _Tensor,
)

# The architectures whose full tensor list expected_tensors knows (a merged model of another is refused at create).
MERGE_ARCHITECTURES = ("llama", "qwen2", "mistral")
CONFIG_NAME = "config.json"
GENERATION_NAME = "generation_config.json"
MANIFEST_NAME = "manifest.json"
SINGLE_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
_SHARD = re.compile(r"^model-(\d{5})-of-(\d{5})\.safetensors$")
_JSON_FILES = (CONFIG_NAME, GENERATION_NAME, MANIFEST_NAME, INDEX_NAME)
LAYOUT = Layout(required=(CONFIG_NAME, MANIFEST_NAME), noun="merged model", a_noun="a merged model",
                allowed=lambda name: name in _JSON_FILES or name == SINGLE_NAME or bool(_SHARD.match(name)),
                listing=f"{CONFIG_NAME}, {MANIFEST_NAME}, {SINGLE_NAME} or its model-0000k-of-0000n shards "
                        f"with {INDEX_NAME}, and {GENERATION_NAME}")


def expected_tensors(model: DeclaredModel) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of the model's transformers checkpoint (tied embeddings: no lm_head)."""
    h, v = model.hidden_size, model.vocab_size
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    if not model.tie_embeddings:
        out["lm_head.weight"] = (v, h)
    for i in range(model.num_layers):
        at = f"model.layers.{i}."
        for name, (n_in, n_out) in model.modules.items():
            group = "self_attn" if name.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else "mlp"
            out[f"{at}{group}.{name}.weight"] = (n_out, n_in)
            if model.attention_bias and name in ("q_proj", "k_proj", "v_proj"):
                out[f"{at}{group}.{name}.bias"] = (n_out,)
        out[f"{at}input_layernorm.weight"] = (h,)
        out[f"{at}post_attention_layernorm.weight"] = (h,)
    return out


def verify_merged(data: bytes | BinaryIO, *, base_model: str, expected_sha256: str | None,
                  max_total_bytes: int = MAX_MERGED_BYTES, model: DeclaredModel | None = None) -> VerifyResult:
    """data: the archive (bytes or a seekable binary file, read in bounded chunks). model: a Hub model's shapes
    (llama, qwen2 or mistral: the architectures MERGE_ARCHITECTURES lists); else the declared base_model."""
    import io

    source: BinaryIO = io.BytesIO(data) if isinstance(data, bytes | bytearray) else data
    problems: list[str] = []
    sha256, size = _sha256_of(source)
    summary: dict[str, Any] = {"size": size, "sha256": sha256, "base_model": base_model}
    try:
        _verify(source, base_model, expected_sha256, max_total_bytes, problems, summary, model)
    except _Stop:
        pass
    if len(problems) > MAX_PROBLEMS:
        problems[MAX_PROBLEMS:] = [f"... and {len(problems) - MAX_PROBLEMS} more problems like the ones above."]
    return VerifyResult(ok=not problems, problems=problems, summary=summary)


def _verify(source: BinaryIO, base_model: str, expected_sha256: str | None, max_total_bytes: int,
            problems: list[str], summary: dict[str, Any], model: DeclaredModel | None = None) -> None:
    declared = model or get_base_model(base_model)
    if declared is None:
        _refuse(problems, f"{base_model!r} is not a declared base model, so its merged weights have nothing to be "
                          "checked against.")
    if expected_sha256 is not None and summary["sha256"] != expected_sha256.lower():
        _refuse(problems, f"The merged archive's sha256 is {summary['sha256']}, not the {expected_sha256} the agent "
                          "reported; the upload is incomplete or was replaced.")
    archive = _safe_unzip(source, summary["size"], MAX_ENTRIES, max_total_bytes, MAX_RATIO, problems, summary,
                          layout=LAYOUT)
    shards = _shard_names(archive, problems)
    config_raw, manifest_raw = archive.read_small(CONFIG_NAME), archive.read_small(MANIFEST_NAME)
    digests = {CONFIG_NAME: hashlib.sha256(config_raw).hexdigest(),
               MANIFEST_NAME: hashlib.sha256(manifest_raw).hexdigest()}
    _check_config(config_raw, declared, problems)
    manifest = _check_manifest(manifest_raw, base_model, problems)
    weight_map = _read_optional(archive, digests, problems)
    tensors, where = _read_shards(archive, shards, digests, problems, summary)
    _check_tensors(tensors, declared, problems, summary)
    if len(shards) > 1 or INDEX_NAME in archive.infos:
        _check_index(weight_map, where, problems)
    summary.update(unpacked_bytes=archive.total, shards=len(shards))
    if manifest is not None:
        _check_listed(manifest, digests, problems)


def _check_manifest(raw: bytes, base_model: str, problems: list[str]) -> dict[str, Any] | None:
    """manifest.json: a JSON object naming the run's base model."""
    manifest = _load_json(raw, MANIFEST_NAME, problems)
    if manifest is not None and manifest.get("base_model") != base_model:
        problems.append(f"{MANIFEST_NAME} names base model {_brief(manifest.get('base_model'))}, but this run "
                        f"trains {base_model!r}.")
    return manifest


def _read_optional(archive: _Archive, digests: dict[str, str], problems: list[str]) -> Any:
    """generation_config.json and the index, where present: JSON objects, their digests recorded.
    Returns the index's weight_map (None without one), checked against the shards later."""
    weight_map = None
    for name in (GENERATION_NAME, INDEX_NAME):
        if name in archive.infos:
            raw = archive.read_small(name)
            digests[name] = hashlib.sha256(raw).hexdigest()
            parsed = _load_json(raw, name, problems)
            if name == INDEX_NAME and parsed is not None:
                weight_map = parsed.get("weight_map")
    return weight_map


def _read_shards(archive: _Archive, shards: list[str], digests: dict[str, str], problems: list[str],
                 summary: dict[str, Any]) -> tuple[dict[str, _Tensor], dict[str, str]]:
    """Each shard read once, in bounded chunks: its header, every value finite, its digest recorded.
    Returns the tensors over all shards by name, and which shard holds each."""
    where: dict[str, str] = {}
    tensors: dict[str, _Tensor] = {}
    for shard in shards:
        with archive.stream(shard) as weights:
            found = _parse_safetensors(weights, archive.size(shard), problems, summary, name=shard)
            _add_shard(shard, found, tensors, where, problems)
            _check_finite(weights, found, problems, name=shard)
            digests[shard] = weights.sha256()
    return tensors, where


def _add_shard(shard: str, found: list[_Tensor], tensors: dict[str, _Tensor], where: dict[str, str],
               problems: list[str]) -> None:
    """The shard's tensors added to those of the shards before it: no tensor in two shards."""
    for t in found:
        if t.name in tensors:
            problems.append(f"{shard} holds {t.name}, which {where[t.name]} holds too.")
        tensors[t.name], where[t.name] = t, shard


def _shard_names(archive: _Archive, problems: list[str]) -> list[str]:
    """The weight files: model.safetensors alone, or model-0000k-of-0000n for k = 1..n, all present."""
    names = sorted(n for n in archive.infos if n == SINGLE_NAME or _SHARD.match(n))
    if names == [SINGLE_NAME]:
        return names
    counts = {int(m[2]) for n in names if (m := _SHARD.match(n))}
    if SINGLE_NAME in names or len(counts) != 1 or names != [
            f"model-{k:05d}-of-{n:05d}.safetensors" for n in counts for k in range(1, n + 1)]:
        _refuse(problems, f"The merged archive's weights must be {SINGLE_NAME} or every shard model-0000k-of-0000n "
                          f"of one n, not {_brief(names, 200)}; export it again.")
    return names


def _check_config(raw: bytes, model: DeclaredModel, problems: list[str]) -> None:
    config = _load_json(raw, CONFIG_NAME, problems)
    if config is None:
        return
    want = {"model_type": model.architecture, "hidden_size": model.hidden_size,
            "num_hidden_layers": model.num_layers, "num_attention_heads": model.num_heads,
            "num_key_value_heads": model.num_kv_heads, "intermediate_size": model.intermediate_size,
            "vocab_size": model.vocab_size}
    for key, value in want.items():
        if config.get(key) != value:
            problems.append(f"{CONFIG_NAME} has {key} = {_brief(config.get(key))}; {model.name} has {value}.")
    if config.get("quantization_config") is not None:
        problems.append(f"{CONFIG_NAME} has a quantization_config; a merged model holds plain weights.")


def _check_tensors(tensors: dict[str, _Tensor], model: DeclaredModel, problems: list[str],
                   summary: dict[str, Any]) -> None:
    expected = expected_tensors(model)
    missing = sorted(set(expected) - set(tensors))
    extra = sorted(set(tensors) - set(expected))
    if missing:
        problems.append(f"The merged weights lack {len(missing)} of {model.name}'s {len(expected)} tensors (first: "
                        f"{', '.join(missing[:3])}); export it again.")
    if extra:
        problems.append(f"The merged weights hold {len(extra)} tensor(s) {model.name} does not have (first: "
                        f"{', '.join(_brief(n) for n in extra[:3])}); a merged model holds no adapter weights.")
    for name in sorted(set(expected) & set(tensors)):
        if tensors[name].shape != expected[name]:
            problems.append(f"{name} has shape {list(tensors[name].shape)}, but {model.name}'s is "
                            f"{list(expected[name])}; was it merged into another model?")
    dtypes = sorted({t.dtype for t in tensors.values()})
    if len(dtypes) > 1:
        problems.append(f"The merged weights mix dtypes {', '.join(dtypes)}; a merged model has its base model's one.")
    summary.update(tensors=len(tensors), dtypes=dtypes)


def _check_index(weight_map: Any, where: dict[str, str], problems: list[str]) -> None:
    if not isinstance(weight_map, dict):
        problems.append(f"{INDEX_NAME} is missing or has no weight_map; a sharded model needs one.")
    elif weight_map != where:
        wrong = sorted(k for k in set(weight_map) | set(where) if weight_map.get(k) != where.get(k))
        problems.append(f"{INDEX_NAME}'s weight_map does not match the shards for {len(wrong)} tensor(s) (first: "
                        f"{', '.join(_brief(n) for n in wrong[:3])}); export it again.")
