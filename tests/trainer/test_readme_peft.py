"""The README's "load the adapter yourself" snippet, run as written: on an adapter the
real trainer wrote, with only the base model's folder swapped for the tiny test model (SmolLM2's
conversion takes minutes); and the folder the README names is the one `make run` keeps models in."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.trainer.conftest import REPO, pirate_rows, run_trainer, write_jsonl

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"


def _snippet() -> str:
    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    [snippet] = [b for b in blocks if "PeftModel.from_pretrained" in b]
    return snippet


def test_the_readme_names_the_folder_make_run_keeps_models_in() -> None:
    from machine.trainer.gguf_models import model_dir

    run_py = (REPO / "tools/devhost/tensorant_devhost/run.py").read_text()
    assert '"TENSORANT_LOCAL_ROOT": str(root / ".tensorant" / "local")' in run_py
    # The local provider's model cache is <local root>/models (shared/providers/local/compute.py).
    expected = model_dir(SMOLLM2, Path(".tensorant/local/models")).as_posix()
    assert f'base = "{expected}"' in _snippet()


def test_the_readme_peft_snippet_loads_a_trained_adapter(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = run_trainer(tiny_model, write_jsonl(tmp_path / "ds.jsonl", pirate_rows(12)), out,
                       {"max_steps": 2, "lora_r": 4, "batch_size": 2, "max_seq_len": 64})
    assert proc.returncode == 0, proc.stdout[-3000:]
    work = tmp_path / "user"
    work.mkdir()
    with zipfile.ZipFile(work / "adapter.zip", "w") as zf:
        for path in out.iterdir():
            zf.write(path, path.name)
    snippet = re.sub(r'^base = ".*?"', f"base = {str(tiny_model)!r}", _snippet(), flags=re.M)
    snippet += "\nprint(type(model).__name__, sorted(model.peft_config))\n"
    done = subprocess.run([sys.executable, "-c", snippet], cwd=work, capture_output=True, text=True, timeout=240,
                          env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                               "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "PeftModelForCausalLM ['default']" in done.stdout, done.stdout
