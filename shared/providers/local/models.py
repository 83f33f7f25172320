"""Which base models the local provider's trainer can load on this host, which has no hub access.

The one control-plane module besides the lifecycle that imports the machine package: the local
provider runs the machine (agent and trainer) on the control plane's own host.
"""

from __future__ import annotations

from machine.trainer import gguf_models
from machine.trainer.run import local_source


def source(base_model: str) -> tuple[str, str]:
    """(how the trainer loads base_model here, in words, or ""; the pip package that would make it loadable, or "")."""
    return local_source(base_model), gguf_models.PACKAGES.get(base_model, "")
