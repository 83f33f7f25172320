"""`tensorant base-models`: the declared base models, their shapes and the GPU memory of a LoRA run."""

from __future__ import annotations

import argparse
from typing import Any

from tensorant_cli.client import Client
from tensorant_cli.commands.common import leaf
from tensorant_cli.output import emit, items, say, table


def add_parser(sub: Any) -> None:
    bm = leaf(sub, "base-models", "declared base models: shapes, parameters, GPU memory of a LoRA run",
              "tensorant base-models")
    bm.set_defaults(fn=cmd_base_models)


def cmd_base_models(args: argparse.Namespace, client: Client) -> int:
    data = client.get("/api/base-models")
    models = items(data, "models")
    if getattr(args, "json", False) or getattr(args, "quiet", False):
        emit(args, data, "", ids=[str(m.get("id")) for m in models])  # -q: the names, for --base-model
        return 0
    rows = [{**m, "params_m": round(m.get("params", 0) / 1e6), "gpu_gb_bf16": (m.get("memory_gb") or {}).get("bf16"),
             "gpu_gb_4bit": (m.get("memory_gb") or {}).get("four_bit")} for m in models]
    table(rows, ["id", "architecture", "params_m", "layers", "hidden", "gpu_gb_bf16", "gpu_gb_4bit", "local_cpu"],
          empty="(no base models)")
    if isinstance(data, dict) and data.get("note"):
        say(f"note: {data['note']}")
    return 0
