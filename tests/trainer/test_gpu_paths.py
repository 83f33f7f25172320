"""What the trainer does on a GPU, checked where the CPU can: the driver-too-old refusal (agent and
trainer), the timed grouped/packed probe behind `batching: auto`, and the memory table's terms against
the tensors the loaded model and peft actually hold (on the meta device, at every declared shape)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from adapter_format.base_models import BASE_MODELS, GiB
from machine.agent.gpu import driver_problem, driver_version
from tests.trainer.conftest import need_torch, pirate_rows

OLD = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n"
OPEN = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  (dvs-builder@U16)\n"


def test_driver_version_and_the_agents_check(tmp_path: Path) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    old.write_text(OLD)
    new.write_text(OPEN)
    assert driver_version(old) == "535.104.05" and driver_version(new) == "580.65.06"
    assert driver_version(tmp_path / "missing") is None
    env = {"TENSORANT_MIN_NVIDIA_DRIVER": "580.65.06", "TENSORANT_NVIDIA_DRIVER_FILE": str(old)}
    said = driver_problem(env)
    assert said is not None and "535.104.05" in said and "580.65.06" in said and "launch again" in said
    assert driver_problem({**env, "TENSORANT_NVIDIA_DRIVER_FILE": str(new)}) is None
    assert driver_problem({**env, "TENSORANT_NVIDIA_DRIVER_FILE": str(tmp_path / "missing")}) is None  # no GPU
    assert driver_problem({"TENSORANT_NVIDIA_DRIVER_FILE": str(old)}) is None  # an image that needs none


def _torch(*, cuda: str | None, available: bool = False, supports: int | None = None) -> Any:
    """What gpu_problem reads of torch, as a module: a GPU build (`cuda`, the runtime's version) that sees no
    GPU cannot be had from the CPU wheel installed here, and importing the real torch only to patch these
    three attributes cost a whole torch import. test_trainer_exits_4_before_loading_anything runs the
    real torch's path end to end."""
    driver = {} if supports is None else {"_cuda_getDriverVersion": lambda: supports}
    return SimpleNamespace(__version__="2.9.1+cu130", cuda=SimpleNamespace(is_available=lambda: available),
                           version=SimpleNamespace(cuda=cuda), _C=SimpleNamespace(**driver))


def test_trainer_refuses_a_gpu_torch_cannot_use(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from machine.trainer.gpu import gpu_problem

    driver = tmp_path / "version"
    driver.write_text(OLD)
    monkeypatch.setitem(sys.modules, "torch", _torch(cuda="13.0"))
    said = gpu_problem(str(driver))
    assert said is not None and "535.104.05" in said and "CUDA 13.0" in said and "CPU" in said
    assert "supports CUDA" not in said  # no libcuda to ask
    assert gpu_problem(str(tmp_path / "none")) is None  # a CPU machine trains on the CPU
    monkeypatch.setitem(sys.modules, "torch", _torch(cuda="13.0", supports=12020))
    assert "the NVIDIA driver is 535.104.05, which supports CUDA 12.2, and this PyTorch 2.9.1+cu130 needs CUDA 13.0" in (
        gpu_problem(str(driver)) or "")
    monkeypatch.setitem(sys.modules, "torch", _torch(cuda="13.0", available=True))
    assert gpu_problem(str(driver)) is None  # torch has its GPU
    monkeypatch.setitem(sys.modules, "torch", _torch(cuda=None))
    assert "CPU build" in (gpu_problem(str(driver)) or "")


def test_trainer_exits_4_before_loading_anything(tiny_model: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.trainer.conftest import REPO, trainer_env, write_jsonl

    driver = tmp_path / "version"
    driver.write_text(OLD)
    dataset = write_jsonl(tmp_path / "d.jsonl", pirate_rows(5))
    env = trainer_env(tiny_model, dataset, tmp_path / "out", {"max_steps": 1})
    env["TENSORANT_NVIDIA_DRIVER_FILE"] = str(driver)
    # torch sees no GPU here, as on a host whose driver is too old for its CUDA.
    proc = subprocess.run([sys.executable, "-m", "machine.trainer.lora"], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 4, proc.stdout[-2000:]
    assert proc.stdout.startswith("trainer: ") and "535.104.05" in proc.stdout  # here: a CPU build of torch
    assert not (tmp_path / "out").exists()


def test_probe_times_both_modes_and_leaves_training_as_it_was(tiny_model: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    need_torch()
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from machine.trainer.batches import FLEX, SEGMENTS, use_segment_attention
    from machine.trainer.config import TrainerSettings
    from machine.trainer.data import normalise
    from machine.trainer.gpu import choice_name, probe_batching
    from machine.trainer.lora import ATTENTION, lora_config
    from tests.support.trainer import encode_all

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    examples = encode_all(tokenizer, [normalise(r) for r in pirate_rows(24)], 48).examples
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    assert use_segment_attention(model)
    model = get_peft_model(model, lora_config(TrainerSettings(lora_dropout=0.1), ATTENTION))
    before = torch.get_rng_state()
    (mode, attention), rates = probe_batching(model, examples, 4, 0, 0, torch.device("cpu"))
    assert mode in ("grouped", "packed") and attention is None and set(rates) == {"grouped", "packed"}
    assert all(v > 0 for v in rates.values()) and rates[mode] == max(rates.values())
    assert torch.equal(torch.get_rng_state(), before)  # dropout's draws are the run's, as without the probe
    assert all(q.grad is None for q in model.parameters())
    # Choices with their attention (batches.candidates): each timed under its own, the winner's left on.
    choices = [("grouped", "sdpa"), ("packed", SEGMENTS)]
    best, rates = probe_batching(model, examples, 4, 0, 0, torch.device("cpu"), choices=choices)
    assert set(rates) == {"grouped", "packed"} and rates[best[0]] == max(rates.values())
    assert model.config._attn_implementation == best[1]
    assert choice_name("packed", FLEX) == "packed_flex" and choice_name("packed", SEGMENTS) == "packed"
    # Flex attention failing in the probe (here: no backward on the CPU; on a GPU, a Triton compile error)
    # is said, given 0 and left out; the run trains under the best of the others.
    before = torch.get_rng_state()
    best, rates = probe_batching(model, examples, 4, 0, 0, torch.device("cpu"),
                                 choices=[*choices, ("packed", FLEX)])
    assert rates["packed_flex"] == 0.0 and best != ("packed", FLEX) and model.config._attn_implementation == best[1]
    assert "trainer: flex attention failed in the batching probe and is not used: NotImplementedError" in \
        capsys.readouterr().out
    assert torch.equal(torch.get_rng_state(), before) and all(q.grad is None for q in model.parameters())


@pytest.mark.parametrize("name", [n for n in sorted(BASE_MODELS) if not n.startswith("tensorant/smoke")])
def test_memory_terms_are_the_tensors_held(name: str) -> None:
    """weights: every tensor at the dtype loading and peft give it (4-bit: the layers' linear weights
    NF4, everything else upcast to fp32 by prepare_model_for_kbit_training); LoRA: the trainable
    parameters peft adds."""
    need_torch()
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from adapter_format.base_models import _NF4_BITS
    from machine.trainer.config import TrainerSettings
    from machine.trainer.lora import ALL_LINEAR, lora_config

    spec = BASE_MODELS[name]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(spec.hf_config(), dtype=torch.bfloat16)
    quantized = {f"{n}.weight" for n, m in model.named_modules()
                 if isinstance(m, torch.nn.Linear) and ".layers." in f".{n}"}
    params = dict(model.named_parameters())
    bf16 = sum(p.numel() * p.element_size() for p in params.values())
    four = sum(p.numel() * _NF4_BITS / 8 if n in quantized else p.numel() * 4 for n, p in params.items())
    assert spec.weight_bytes() == bf16
    assert abs(spec.weight_bytes(load_in_4bit=True) - four) < 1024
    with torch.device("meta"):
        peft_model = get_peft_model(model, lora_config(TrainerSettings(lora_r=16), list(ALL_LINEAR)))
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    assert trainable == spec.lora_params(16, list(ALL_LINEAR))
    if name == "meta-llama/Llama-3.1-8B-Instruct":
        # The 4-bit table's correction: fp32 embeddings and head (4.2 GB) weigh more than the NF4 layers.
        assert 7 * GiB < spec.weight_bytes(load_in_4bit=True) < 8 * GiB
        assert 15.5 * GiB < spec.peak_allocated(batch_size=2, seq_len=512) < 16.5 * GiB  # torchtune: 16.2
        assert 12 * GiB < spec.estimate_memory(load_in_4bit=True) < 13 * GiB
