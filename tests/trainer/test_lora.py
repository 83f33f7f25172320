"""The real trainer end to end on the CPU: `python -m machine.trainer.lora` with the agent's
environment contract, on a tiny random Llama (heads x head_dim != hidden) and a local tokenizer.

Three trainer subprocesses in all (imports dominate on a busy CPU): the same settings twice, which
must give the same adapter bytes (the first one writing checkpoints, the second none); each run
covers all three dataset shapes, all-linear targets, truncation, the eval split, samples, and an
output the verifier accepts with shapes checked. The third resumes from the first one's last
checkpoint and must end with the same adapter bytes.
"""

from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path

import pytest

from adapter_format.base_models import get_base_model
from adapter_format.verify import verify_adapter
from tests.support.adapters import lora_shapes, zip_files
from tests.trainer.conftest import TINY, need_torch, pirate_rows, run_trainer, start_trainer, trainer_env, write_jsonl

SETTINGS = {"max_steps": 24, "learning_rate": 0.01, "batch_size": 4, "lora_r": 4, "lora_alpha": 8,
            "target_modules": "all-linear", "max_seq_len": 40, "warmup_ratio": 0.1, "lora_dropout": 0.0,
            "sample_prompts": 1, "seed": 7, "kind": "trial", "checkpoint_every_steps": 10}
FILES = ("adapter_config.json", "adapter_model.safetensors", "manifest.json")


@pytest.fixture(scope="module")
def runs(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> list[tuple[Path, str]]:
    need_torch()
    base = tmp_path_factory.mktemp("runs")
    dataset = write_jsonl(base / "data.jsonl", pirate_rows(30))
    # Both at once: on a busy CPU the imports wait for the scheduler, so two processes finish
    # in little more than the time of one.
    targets = [base / "out0", base / "out1"]
    envs = [trainer_env(tiny_model, dataset, t, SETTINGS) for t in targets]
    envs[0]["TENSORANT_CHECKPOINT_DIR"] = str(base / "checkpoint")  # as the agent passes it; out1 checkpoints nothing
    procs = [start_trainer(env) for env in envs]
    out = []
    for target, proc in zip(targets, procs, strict=True):
        log, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, log[-4000:]
        out.append((target, log))
    return out


def test_loss_falls_and_progress_lines(runs: list[tuple[Path, str]]) -> None:
    out, log = runs[0]
    progress = [line for line in log.splitlines() if line.startswith("progress=")]
    assert len(progress) == 24
    fields = dict(kv.split("=") for kv in progress[-1].split())
    assert fields["progress"] == "1.0000" and fields["step"] == "24" and "lr" in fields and "loss" in fields
    manifest = json.loads((out / "manifest.json").read_text())
    loss = manifest["loss"]
    assert len(loss) == 24
    # Noisy per step: compare the first and last quarter.
    assert sum(loss[-6:]) / 6 < sum(loss[:6]) / 6 - 0.3, loss
    assert manifest["eval_loss"] < manifest["eval_loss_before"]
    assert manifest["trainer"] == "lora" and manifest["base_model"] == TINY and manifest["steps"] == 24
    assert manifest["eval_examples"] == 3 and manifest["rows"] == 30  # 30 >= 20 rows: 10 % held out
    assert manifest["truncated"] > 0  # the doubled text rows exceed max_seq_len=40
    assert "were truncated" in log and "trial run" in log
    assert manifest["precision"] == "fp32" and manifest["device"].startswith("cpu")
    assert {"torch", "transformers", "peft"} <= set(manifest["versions"])
    assert manifest["settings"]["lora_r"] == 4 and manifest["tokens"] > 0
    assert "sample with adapter:" in log and len(manifest["samples"]) == 1


def test_the_final_adapter_is_written_before_the_final_eval_and_samples(runs: list[tuple[Path, str]]) -> None:
    """A runtime limit passing while the trainer ran its samples found no final adapter: it is written (and
    said, for the agent to upload) right after the last step, then again with the eval and samples."""
    _, log = runs[0]
    lines = log.splitlines()
    final = next(i for i, line in enumerate(lines) if line.startswith("trainer: final adapter written (24 of 24"))
    last_step = max(i for i, line in enumerate(lines) if line.startswith("progress="))
    samples = next(i for i, line in enumerate(lines) if line.startswith("sample prompt:"))
    after = next(i for i, line in enumerate(lines) if "eval_loss after training" in line)
    assert last_step < final < min(samples, after), lines[last_step:]


def test_manifest_counts_per_split_and_padding(runs: list[tuple[Path, str]], tiny_model: Path) -> None:
    from transformers import AutoTokenizer

    from machine.trainer.config import parse_settings
    from machine.trainer.lora import split
    from tests.support.trainer import encode_all, load_examples

    out, log = runs[0]
    manifest = json.loads((out / "manifest.json").read_text())
    s = parse_settings(json.dumps(SETTINGS))[0]
    train, held, _ = split(load_examples(out.parent / "data.jsonl"), s)
    tok = AutoTokenizer.from_pretrained(tiny_model)
    enc_train, enc_held = encode_all(tok, train, s.max_seq_len), encode_all(tok, held, s.max_seq_len)
    # truncated/dropped: training rows only, as `dropped` always was; eval_*: the held-out rows.
    assert (manifest["truncated"], manifest["dropped"]) == (enc_train.truncated, enc_train.dropped)
    assert (manifest["eval_truncated"], manifest["eval_dropped"]) == (enc_held.truncated, enc_held.dropped)
    assert "training rows" in manifest["row_counts"] and "held-out" in manifest["row_counts"]
    # Padding: real tokens vs what the model processed.
    assert manifest["batching"] == "packed"  # auto on the CPU: one row per micro-batch, attention per example
    assert manifest["processed_tokens"] == manifest["tokens"] > 0
    assert manifest["padding_fraction"] == 0.0
    assert manifest["processed_tokens_per_s"] == manifest["tokens_per_s"] > 0
    assert manifest["train_cpu_seconds"] > 0
    assert "batching=packed (attention per example)" in log


def _tensors(raw: bytes) -> dict[str, tuple[list[int], bytes]]:
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8: 8 + n])
    header.pop("__metadata__", None)
    return {k: (v["shape"], raw[8 + n + v["data_offsets"][0]: 8 + n + v["data_offsets"][1]]) for k, v in header.items()}


def test_every_lora_b_trained_and_shapes_match(runs: list[tuple[Path, str]]) -> None:
    out, _ = runs[0]
    tensors = _tensors((out / "adapter_model.safetensors").read_bytes())
    spec = get_base_model(TINY)
    assert spec is not None
    assert len(tensors) == 2 * spec.num_layers * 7  # all-linear: q,k,v,o,gate,up,down
    shapes = lora_shapes(spec, 4, list(spec.modules))
    for name, (shape, data) in tensors.items():
        module = name.split(".")[-3]
        a_shape, b_shape = shapes[module]
        if ".lora_B." in name:
            assert shape == list(b_shape), name
            assert any(data), f"{name} is still all zero: it never trained"
        else:
            assert shape == list(a_shape), name
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == TINY
    assert config["target_modules"] == sorted(config["target_modules"])


def test_verifier_accepts_the_output(runs: list[tuple[Path, str]], tmp_path: Path) -> None:
    out, _ = runs[0]
    # As the agent exports it, and as zipfile.writestr(name, data) writes it (mode 0o600, no type bits).
    archive = tmp_path / "adapter.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for name in FILES:
            zf.writestr(name, (out / name).read_bytes())
    for data in (archive.read_bytes(), zip_files({n: (out / n).read_bytes() for n in FILES})):
        result = verify_adapter(data, base_model=TINY, expected_sha256=None, provider="aws")
        assert result.ok, result.problems
        assert result.summary["base_model_declared"] is True and result.summary["modules"] == 14
        assert result.summary["trainer"] == "lora"
    # The same adapter named for another declared model fails the shape check.
    config = json.loads((out / "adapter_config.json").read_text()) | {"base_model_name_or_path": "tensorant/tiny-qwen2"}
    files = {n: (out / n).read_bytes() for n in FILES} | {"adapter_config.json": json.dumps(config).encode()}
    files["manifest.json"] = json.dumps({"base_model": "tensorant/tiny-qwen2"}).encode()
    result = verify_adapter(zip_files(files), base_model="tensorant/tiny-qwen2", expected_sha256=None)
    assert not result.ok and any("q_proj maps 64 -> 64" in p for p in result.problems), result.problems


def test_same_seed_same_adapter_bytes(runs: list[tuple[Path, str]]) -> None:
    (a, _), (b, _) = runs
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_bad_settings_exit_2(tiny_model: Path, tmp_path: Path) -> None:
    # Settings are checked before torch is imported, so this run is cheap.
    dataset = write_jsonl(tmp_path / "d.jsonl", pirate_rows(3))
    proc = run_trainer(tiny_model, dataset, tmp_path / "out", {"lora_r": 0})
    assert proc.returncode == 2 and "training.lora_r must be between 1 and 256" in proc.stdout
    assert not (tmp_path / "out").exists()


def test_gpu_check_helpers_on_the_trainer_output(runs: list[tuple[Path, str]]) -> None:
    # tests/gpu/check_training.py's export and dataset, on this run's output (its --tiny mode runs
    # the whole path on the CPU: python -m tests.gpu.check_training --tiny).
    from tests.gpu.check_training import TINY as CASES
    from tests.gpu.check_training import dataset_rows, export_zip, figures

    out, _ = runs[0]
    result = verify_adapter(export_zip(out), base_model=TINY, expected_sha256=None, provider="azure")
    assert result.ok, result.problems
    assert CASES[0].base_model == TINY and len(dataset_rows(5)) == 5
    # The figures it prints per case, from this CPU run's manifest (no GPU: no peak GPU memory).
    manifest = json.loads((out / "manifest.json").read_text())
    got = figures(manifest, (2 * 2**30, 3 * 2**30))
    assert got["batching"] == "packed" and got["padding_fraction"] == 0.0
    assert (got["table_peak_gib"], got["table_needed_gib"]) == (2.0, 3.0)
    assert got["real_tokens_per_s"] == manifest["tokens_per_s"] > 0
    assert got["real_tokens_per_cpu_s"] == round(manifest["tokens"] / manifest["train_cpu_seconds"], 1)
    assert got["trained_tokens_per_s"] < got["real_tokens_per_s"]  # prompts are real tokens, not learned ones
    assert got["peak_gpu_gib"] is None and got["peak_of_table"] is None


def test_checkpoints_keep_the_last_one_whole(runs: list[tuple[Path, str]]) -> None:
    out, log = runs[0]
    root = out.parent / "checkpoint"
    # Every 10 steps of 24: steps 10 and 20 (the last step needs none); only the last one is kept.
    assert [line.split()[1] for line in log.splitlines() if line.startswith("checkpoint ")] == ["step=10", "step=20"]
    assert sorted(p.name for p in root.iterdir()) == ["step-000020"]
    folder = root / "step-000020"
    assert sorted(p.name for p in folder.iterdir()) == [*FILES[:2], "manifest.json", "trainer_state.pt"]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert (manifest["checkpoint_step"], manifest["steps"], manifest["trainer"]) == (20, 24, "lora")
    result = verify_adapter(zip_files({n: (folder / n).read_bytes() for n in FILES}), base_model=TINY,
                            expected_sha256=None, provider="aws")
    assert result.ok and result.summary["checkpoint_step"] == 20, result.problems


def test_resuming_from_the_last_checkpoint_ends_with_the_same_adapter(
        runs: list[tuple[Path, str]], tiny_model: Path) -> None:
    """Adapter, optimizer, scheduler and RNG state restored, and the first 20 steps of the same
    seeded data order skipped: the 4 steps left give the uninterrupted run's bytes exactly."""
    out, _ = runs[0]
    resumed = out.parent / "resumed"
    env = trainer_env(tiny_model, out.parent / "data.jsonl", resumed, SETTINGS)
    env["TENSORANT_RESUME_FROM"] = str(out.parent / "checkpoint" / "step-000020")
    proc = start_trainer(env)
    log, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, log[-4000:]
    assert "resumed from" in log and "at step 21 of 24" in log
    assert [line.split()[1] for line in log.splitlines() if line.startswith("progress=")] == \
        [f"step={n}" for n in range(21, 25)]
    assert (resumed / "adapter_model.safetensors").read_bytes() == (out / "adapter_model.safetensors").read_bytes()
    a, b = (json.loads((d / "manifest.json").read_text()) for d in (out, resumed))
    assert b["resumed_from_step"] == 20 and "resumed_from_step" not in a
    assert (b["loss"], b["tokens"], b["eval_loss_before"]) == (a["loss"], a["tokens"], a["eval_loss_before"])

    # Other settings than the checkpoint's: refused before any training (the data order would differ).
    env["TENSORANT_TRAINING"] = json.dumps(SETTINGS | {"seed": 8})
    proc = start_trainer(env)
    log, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "written for other settings" in log


def test_sigterm_during_training_saves_a_checkpoint_of_that_step_and_exits_143(
        tiny_model: Path, tmp_path: Path) -> None:
    """`cancel --keep` before the first checkpoint (every 50 steps or 600 s) left nothing to resume from: the
    agent's SIGTERM now makes the trainer save one at the step it is on."""
    import signal

    need_torch()
    dataset = write_jsonl(tmp_path / "data.jsonl", pirate_rows(30))
    env = trainer_env(tiny_model, dataset, tmp_path / "out", {**SETTINGS, "checkpoint_every_steps": 50})
    env.update(TENSORANT_CHECKPOINT_DIR=str(tmp_path / "checkpoint"), TENSORANT_TEST_STEP_SLEEP_S="0.3")
    proc = start_trainer(env)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:  # the first step done: stop it as the agent does
        lines.append(line)
        if line.startswith("progress="):
            proc.send_signal(signal.SIGTERM)
            break
    rest, _ = proc.communicate(timeout=120)
    log = "".join(lines) + rest
    assert proc.returncode == 143, log[-3000:]
    saved = [line for line in log.splitlines() if line.startswith("checkpoint step=")]
    assert len(saved) == 1, log[-3000:]
    step = int(saved[0].split()[1].split("=")[1])
    assert 1 <= step < 24 and f"stopped (SIGTERM) at step {step} of 24; its checkpoint is saved" in log
    manifest = json.loads((Path(saved[0].split("dir=", 1)[1]) / "manifest.json").read_text())
    assert manifest["checkpoint_step"] == step and manifest["steps"] == 24
    assert not (tmp_path / "out" / "adapter_model.safetensors").exists()  # no final adapter: training stopped
