"""Cloud-init user data that runs the training container with the agent (AWS and Azure hosts).

The host keeps its output under /var/lib/tensorant/data (mounted at /workspace/data in
the container), so a retained VM still holds adapter.zip for recovery. The environment
file is written root-only and holds one line, TENSORANT_BOOTSTRAP=<base64 JSON> (see
shared/providers/bootstrap_env.py), so no value can add a variable; nothing secret is put
on a command line.
"""

from __future__ import annotations

import shlex

from shared.providers import bootstrap_env
from shared.providers.base import Bootstrap

HOST_DATA_DIR = "/var/lib/tensorant/data"
CONTAINER_DATA_DIR = "/workspace/data"
MAX_USER_DATA = 16 * 1024  # EC2's limit; Azure's custom data allows more, the tighter bound serves both


def render(bootstrap: Bootstrap) -> str:
    env = dict(bootstrap.env)
    env.setdefault("TENSORANT_DATA_DIR", CONTAINER_DATA_DIR)
    indented = "      " + bootstrap_env.env_file(env).rstrip("\n")  # one line: the name and base64
    image = shlex.quote(bootstrap.container_image)
    script = (
        "#!/bin/bash\n"
        "set -euo pipefail\n"
        f"mkdir -p {HOST_DATA_DIR}\n"
        f"docker pull {image}\n"
        "docker rm -f tensorant-train >/dev/null 2>&1 || true\n"
        "exec docker run --name tensorant-train --gpus all --restart no "
        f"--env-file /etc/tensorant/agent.env -v {HOST_DATA_DIR}:{CONTAINER_DATA_DIR} {image}\n"
    )
    script_indented = "\n".join("      " + line for line in script.splitlines())
    text = (
        "#cloud-config\n"
        "write_files:\n"
        "  - path: /etc/tensorant/agent.env\n"
        "    permissions: '0600'\n"
        "    owner: root:root\n"
        "    content: |\n"
        f"{indented}\n"
        "  - path: /usr/local/bin/tensorant-train\n"
        "    permissions: '0700'\n"
        "    content: |\n"
        f"{script_indented}\n"
        "runcmd:\n"
        "  - [ /usr/local/bin/tensorant-train ]\n"
    )
    if len(text.encode()) > MAX_USER_DATA:
        raise ValueError(f"user data is {len(text.encode())} bytes, over the 16 KB limit")
    return text
