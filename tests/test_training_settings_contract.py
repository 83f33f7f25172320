"""The training settings are defined twice, and this test keeps the two the same (issue 32.8).

The API validates them at POST /api/runs (shared.models.TrainingSettings, pydantic) and the trainer
again on the machine (machine.trainer.config: TrainerSettings and its range tables), because the trainer
may be run by hand and the machine package may not import the control plane (tests/test_layers.py).
A setting that one side accepts and the other refuses fails a run after its GPU was paid for (the API
took max_examples up to 10,000,000, the trainer any number), so every field is compared: its name, type,
default, bounds, and allowed values; then both sides are given the same probe values around each bound
and must accept and refuse alike. It reads whatever fields the two declare: a setting added to one side
only fails here."""

from __future__ import annotations

import json
import types
import typing
from dataclasses import MISSING, dataclass, fields
from typing import Any, Literal

import annotated_types
import pytest
from pydantic import ValidationError
from pydantic.fields import FieldInfo

from machine.trainer import config as trainer
from machine.trainer.templates import PRESETS
from shared.models import TrainingSettings

# Differences on purpose, with why; the test fails when one is no longer there, so this list stays true.
# kind: the API leaves it unset (None) in a request and sets it from the run's kind before the run is
# stored (shared/services/api/runs/drafts.py); the trainer run by hand defaults to a full run.
INTENDED = {"kind": {"nullable", "default"}}
# Fields that are checked only together with another (both sides refuse early_stopping_patience alone).
CONTEXT = {"early_stopping_patience": {"eval_every_steps": 10}}


@dataclass(frozen=True)
class Spec:
    kind: str  # int | float | bool | str | choice
    nullable: bool
    default: Any
    choices: tuple[str, ...] = ()
    low: float | None = None
    low_open: bool = False
    high: float | None = None
    high_open: bool = False
    max_length: int | None = None


def _split(annotation: Any) -> tuple[Any, bool]:
    """(the annotation without None, whether None is allowed)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        rest = [a for a in args if a is not type(None)]
        assert len(rest) == 1, f"one type besides None, not {annotation}"
        return rest[0], len(rest) < len(args)
    return annotation, False


def _kind(base: Any) -> tuple[str, tuple[str, ...]]:
    if typing.get_origin(base) is Literal:
        return "choice", tuple(typing.get_args(base))
    return {bool: "bool", int: "int", float: "float", str: "str"}[base], ()


def api_spec(info: FieldInfo) -> Spec:
    base, nullable = _split(info.annotation)
    kind, choices = _kind(base)
    bounds: dict[str, Any] = {}
    for m in info.metadata:
        if isinstance(m, annotated_types.Ge):
            bounds["low"] = m.ge
        elif isinstance(m, annotated_types.Gt):
            bounds.update(low=m.gt, low_open=True)
        elif isinstance(m, annotated_types.Le):
            bounds["high"] = m.le
        elif isinstance(m, annotated_types.Lt):
            bounds.update(high=m.lt, high_open=True)
        elif isinstance(m, annotated_types.MaxLen):
            bounds["max_length"] = m.max_length
    return Spec(kind, nullable, info.default, choices, **bounds)


def trainer_spec(name: str, annotation: Any, default: Any) -> Spec:
    base, nullable = _split(annotation)
    assert nullable == (name in trainer._NULLABLE), f"trainer: {name}'s type and _NULLABLE disagree"
    if name in trainer._CHOICES:
        assert base is str, f"trainer: {name} has choices but is typed {base}"
        return Spec("choice", nullable, default, trainer._CHOICES[name])
    if name in trainer._INT:
        int_low, int_high = trainer._INT[name]
        assert base is int, f"trainer: {name} is range-checked as a whole number but typed {base}"
        return Spec("int", nullable, default, low=int_low, high=int_high)
    if name in trainer._FLOAT:
        low, high, low_open = trainer._FLOAT[name]
        assert base is float, f"trainer: {name} is range-checked as a number but typed {base}"
        return Spec("float", nullable, default, low=low, low_open=low_open, high=high)
    if name in trainer._BOOL:
        assert base is bool, f"trainer: {name} is checked as true/false but typed {base}"
        return Spec("bool", nullable, default)
    assert name == "chat_template", f"trainer: {name} is in none of config.py's tables, so it is never checked"
    return Spec("str", nullable, default, max_length=trainer.MAX_CHAT_TEMPLATE)


def api_specs() -> dict[str, Spec]:
    return {name: api_spec(info) for name, info in TrainingSettings.model_fields.items()}


def trainer_specs() -> dict[str, Spec]:
    hints = typing.get_type_hints(trainer.TrainerSettings)
    out = {}
    for f in fields(trainer.TrainerSettings):
        assert f.default is not MISSING, f"trainer: {f.name} has no default"
        out[f.name] = trainer_spec(f.name, hints[f.name], f.default)
    return out


def _differences(api: Spec, machine: Spec) -> set[str]:
    return {f.name for f in fields(Spec) if getattr(api, f.name) != getattr(machine, f.name)}


def test_both_sides_declare_the_same_fields() -> None:
    api, machine = set(api_specs()), set(trainer_specs())
    assert api - machine == set(), f"the API takes settings the trainer ignores: {sorted(api - machine)}"
    assert machine - api == set(), f"the trainer reads settings the API refuses: {sorted(machine - api)}"


@pytest.mark.parametrize("name", sorted(set(api_specs()) & set(trainer_specs())))
def test_each_field_has_the_same_type_default_bounds_and_choices(name: str) -> None:
    api, machine = api_specs()[name], trainer_specs()[name]
    differ = _differences(api, machine)
    intended = INTENDED.get(name, set())
    assert differ - intended == set(), (
        f"training.{name} differs between shared/models.py and machine/trainer/config.py in "
        f"{sorted(differ - intended)}:\n  API:     {api}\n  trainer: {machine}")
    assert intended - differ == set(), f"training.{name} now agrees on {sorted(intended - differ)}: drop it from INTENDED"


def _probes(api: Spec, machine: Spec) -> list[Any]:
    """Values at and just past each side's bounds, of the wrong type, and None."""
    probes: list[Any] = [None, True, "1", [], {}]
    for spec in (api, machine):
        if spec.kind in ("int", "float"):
            step = 1 if spec.kind == "int" else 1e-9
            for edge in (spec.low, spec.high):
                if edge is not None:
                    probes += [edge, edge - step, edge + step]
            probes += [spec.default, 2**63, -1, 0, 0.5, 1.0]
        elif spec.kind == "choice":
            probes += [*spec.choices, "", "other", spec.choices[0].upper()]
        elif spec.kind == "bool":
            probes += [True, False, 0, 1, "true"]
        elif spec.kind == "str":
            probes += ["", " ", *PRESETS, "chatml", "llama3", "plain", "vicuna",
                       "{% for m in messages %}{{ m.content }}{% endfor %}"]
            if spec.max_length is not None:
                probes += ["messages" + "x" * (spec.max_length - 8), "messages" + "x" * (spec.max_length - 7)]
    unique = {(type(p), repr(p)): p for p in probes}  # 1 and True, 1 and 1.0 are all kept
    return list(unique.values())


def _api_accepts(name: str, value: Any) -> bool:
    try:
        TrainingSettings.model_validate({**CONTEXT.get(name, {}), name: value})
    except ValidationError:
        return False
    return True


def _trainer_accepts(name: str, value: Any) -> bool:
    try:
        trainer.parse_settings(json.dumps({**CONTEXT.get(name, {}), name: value}))
    except trainer.SettingsError:
        return False
    return True


@pytest.mark.parametrize("name", sorted(set(api_specs()) & set(trainer_specs())))
def test_both_sides_accept_and_refuse_the_same_values(name: str) -> None:
    api, machine = api_specs()[name], trainer_specs()[name]
    disagree = []
    for value in _probes(api, machine):
        if name in INTENDED and value is None:
            continue  # kind: None is the API's "not set yet" (INTENDED)
        a, t = _api_accepts(name, value), _trainer_accepts(name, value)
        if a != t:
            shown = value if not isinstance(value, str) or len(value) < 40 else f"<{len(value)} characters>"
            disagree.append(f"{shown!r}: API {'accepts' if a else 'refuses'}, trainer {'accepts' if t else 'refuses'}")
    assert not disagree, f"training.{name}:\n  " + "\n  ".join(disagree)


def test_what_the_control_plane_hands_the_trainer_is_read_back_unchanged() -> None:
    # As the launch step sends it (shared/services/steps/launch.py): the stored settings, kind set.
    for kind in ("trial", "full"):
        sent = TrainingSettings(kind=kind).model_dump(mode="json")
        read, warnings = trainer.parse_settings(json.dumps(sent, sort_keys=True, separators=(",", ":")))
        assert warnings == []
        assert read.as_dict() == sent


def test_the_comparison_sees_a_bound_that_drifts(monkeypatch: pytest.MonkeyPatch) -> None:
    # The max_examples difference this test was written for: the trainer without the API's upper bound.
    monkeypatch.setitem(trainer._INT, "max_examples", (1, None))
    api, machine = api_specs()["max_examples"], trainer_specs()["max_examples"]
    assert _differences(api, machine) == {"high"}
    assert not _api_accepts("max_examples", 10_000_001) and _trainer_accepts("max_examples", 10_000_001)
