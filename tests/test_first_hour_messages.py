"""A newcomer's first hour (issue 31): errors and forecasts that say what to fix, in words a person reads."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from shared.errors import invalid
from shared.models import RunCreate


def _create(**training: object) -> dict[str, object]:
    return {"project_id": "p1", "provider": "local", "base_model": "HuggingFaceTB/SmolLM2-135M-Instruct",
            "dataset_id": "d1", "training": training}


def test_an_unknown_key_names_the_nearest_valid_one_and_lists_them() -> None:
    """`lr: Extra inputs are not permitted` said nothing of what to send instead."""
    with pytest.raises(ValidationError) as caught:
        RunCreate.model_validate(_create(lr=1e-4))
    err = invalid(caught.value, model=RunCreate)
    field = next(e for e in err.errors if e["field"] == "training.lr")
    assert "did you mean learning_rate?" in field["message"]
    assert "batch_size" in field["message"] and "learning_rate" in field["message"]
    assert "Extra inputs" not in err.detail
    # A near misspelling is found by its likeness; a key of the request itself lists the request's fields.
    with pytest.raises(ValidationError) as caught:
        RunCreate.model_validate({**_create(), "base_modle": "x"})
    top = invalid(caught.value, model=RunCreate).errors
    assert any(e["field"] == "base_modle" and "did you mean base_model?" in e["message"] for e in top)
