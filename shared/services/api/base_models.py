"""GET /api/base-models: the declared base models offered to users, with their memory needs and whether
the local CPU provider trains them. What a model needs and which offer holds it is the run domain's
(shared/runs/admission.py); the shapes and the memory formula live in adapter_format/base_models.py.
"""

from __future__ import annotations

from typing import Any

from shared.context import Context
from shared.models import TrainingSettings
from shared.runs.admission import fits_cpu, loadable, offered, providers_on_cpu


def list_view(ctx: Context) -> dict[str, Any]:
    cpu = providers_on_cpu()
    max_b = max((c.max_params for c in cpu.values()), default=0) / 1e9
    items = []
    for model in offered(ctx):
        d = model.describe()
        bf16, four_bit = d.pop("memory_gb_bf16"), d.pop("memory_gb_4bit")
        items.append({"id": d.pop("name"), **d, "layers": model.num_layers, "hidden": model.hidden_size,
                      "memory_gb": {"bf16": bf16, "four_bit": four_bit},
                      "local_cpu": any(fits_cpu(model, c) and loadable(model, name) for name, c in cpu.items())})
    defaults = TrainingSettings()
    return {"items": items,
            "note": f"memory_gb: peak GPU memory of a LoRA run at the default settings (batch "
                    f"{defaults.batch_size}, max_seq_len {defaults.max_seq_len}, rank {defaults.lora_r}, "
                    f"attention targets, gradient checkpointing); local_cpu: trainable on the {' or '.join(cpu) or 'no'} "
                    f"provider (up to {max_b:g}B parameters, and loadable on this host without the hub)"}
