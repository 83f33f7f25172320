"""Cloud-init user data that runs the training container with the agent (AWS and Azure hosts).

The host keeps its output under /var/lib/tensorant/data (mounted at /workspace/data in
the container), so a retained VM still holds adapter.zip for recovery. The user data holds
no secret: EC2 user data and Azure customData stay readable by any process on the machine
through the metadata service. It holds a one-time claim (bootstrap_env.claim), which the
script exchanges once (POST /api/agent/runs/<id>/bootstrap) for the environment, written
root-only as one line, TENSORANT_BOOTSTRAP=<base64 JSON> (see bootstrap_env.py), so no value
can add a variable; nothing secret is put on a command line. The claim is the same on every
launch attempt of a run, so a retried launch sends the same user data.

A failed start must cost minutes, not the boot deadline: the script retries a failed pull
with backoff, and when the pull, the container start or the agent fails before the agent
ever reported, the machine itself posts the failure (stage, exit code, last lines) to
POST /api/agent/runs/<id>/boot-failed with the run's token, read by curl from a root-only
header file. The control plane then releases the run as failed (nothing ran, nothing to
recover). A run the agent already reported on ignores such a report except as an event.

The container runs under systemd, not inside cloud-init: cloud-init writes the script and the
unit tensorant-run.service, and its runcmd only enables the unit and starts it without waiting.
So the hours of training output go to the journal (bounded by journald; docker keeps its own
rotated copy), not to cloud-init's final stage, its log and the serial console, and a stop of the
machine reaches the agent through the unit's ExecStop (`docker stop`, a grace of STOP_GRACE_S).

After a reboot (a retained machine started again by `recover --start` or `recover --resume`):
cloud-init runs runcmd once per instance, and a stop/start keeps the instance, so nothing of
cloud-init's starts anything again; the unit is enabled, so systemd starts it at every boot. The
script then neither exchanges the claim (its environment is on the disk) nor pulls the image
(pulled on an earlier boot: a resumed run trains with the image it started with, and a registry
outage does not stop a recovery), and the container starts again on the kept disk. What it does
is the agent's state file's to decide (machine/agent/agent.py): a completed or stopped run idles
until the machine is stopped again; a run stopped with a checkpoint waits, heartbeating, for the
control plane's resume, which `recover --resume` gives and `recover --start` does not (the
machine then stays idle for the recovery until it is stopped, by the owner or the idle stop).

tests/machine.py executes exactly this text (cloud-init's schema check, its files written
under a sandbox root, its runcmd run by bash with `systemctl`, `docker` and `sleep` shimmed:
tests/systemd_shim.py starts the unit as systemd would).
"""

from __future__ import annotations

import re
import shlex

from shared.providers.base import Bootstrap

HOST_DATA_DIR = "/var/lib/tensorant/data"
CONTAINER_DATA_DIR = "/workspace/data"
ENV_FILE = "/etc/tensorant/agent.env"
REPORT_HEADER_FILE = "/etc/tensorant/report.header"
SCRIPT = "/usr/local/bin/tensorant-train"
UNIT_NAME = "tensorant-run.service"
UNIT = f"/etc/systemd/system/{UNIT_NAME}"
# The image this machine pulled, once pulled: a later boot does not pull again.
PULLED_STAMP = "/var/lib/tensorant/pulled-image"
# A stop of the machine (the cloud stops it, a poweroff) gives the agent this long after its SIGTERM to record
# the stop and end its trainer (machine.agent: 30 s for the trainer), then docker kills it.
STOP_GRACE_S = 60
POWEROFF_EXIT = 80  # machine.agent.guard.POWEROFF_EXIT: the agent stopped by itself and asks for a poweroff
BOOT_LOG = "/var/log/tensorant-bootstrap.log"
MAX_USER_DATA = 16 * 1024  # EC2's limit; Azure's custom data allows more, the tighter bound serves both
# docker pull: this many attempts, waiting 15, 30, 60 s between them (a registry hiccup or a
# rate limit passes; a wrong image name or missing credentials fail in under two minutes).
PULL_ATTEMPTS = 4
PULL_FIRST_DELAY_S = 15
# One attempt's limit: a pull that hangs fails like any other (the 3 GB image takes minutes, not ten).
PULL_TIMEOUT_S = 600
SHM_SIZE = "8g"
# The machine must exchange its claim this long after its create call (it booted and reached the
# control plane: 1-5 minutes on EC2 and Azure GPU machines), or heartbeat-check releases it
# (deadlines.first_report_by); the exchange then allows the pull the provisioning timeout.
FIRST_REPORT_S = 600
CLAIM_RE = re.compile(r"^[A-Za-z0-9._-]{1,300}$")

# Exit codes of `docker run` that are docker's own, not the container's: 125 the daemon could not
# create or start it (no NVIDIA runtime: "could not select device driver"), 126/127 the entrypoint
# cannot be run. Anything else is the agent's exit.
_SCRIPT = r"""#!/bin/bash
# Runs the training container, as the systemd unit __UNIT_NAME__ (at every boot). First it exchanges
# the one-time claim below for the machine's environment (the claim is dead afterwards: nothing in the
# user data is a secret then). When the pull, the container start or the agent fails before the agent
# reported, it tells the control plane, so the run is released within minutes.
# `tensorant-train stop` is the unit's ExecStop: the machine is stopping.
set -uo pipefail
IMAGE=__IMAGE__
CLAIM_URL=__CLAIM_URL__
REPORT_URL=__REPORT_URL__
DATA=__DATA__
LOG=__LOG__
STAMP=__STAMP__
if [ "${1:-}" = stop ]; then
  # SIGTERM to the agent, which records the stop and ends its trainer; killed after the grace.
  docker stop --time __STOP_GRACE__ tensorant-train >/dev/null 2>&1
  exit 0
fi
mkdir -p "$DATA" "$(dirname __ENV_FILE__)"
touch "$LOG" && chmod 600 "$LOG"

say() { echo "tensorant-train: $*" | tee -a "$LOG"; }

# The last lines of the log as a JSON array of strings (printable ASCII only, so no escape is missed).
last_lines_json() {
  tail -n 20 "$LOG" | LC_ALL=C tr -cd '\11\12\40-\176' | LC_ALL=C tr '\11' ' ' \
    | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/"/' -e 's/$/"/' | paste -sd, -
}

report() {  # stage exit_code attempts
  local body try
  body="{\"stage\":\"$1\",\"exit_code\":$2,\"attempts\":$3,\"last_lines\":[$(last_lines_json)]}"
  for try in 1 2 3 4 5; do
    if curl -fsS --max-time 20 -X POST -H @__HEADER__ -H 'Content-Type: application/json' \
        --data-binary "$body" "$REPORT_URL" >/dev/null; then
      say "reported the failure ($1, exit code $2) to the control plane"
      return 0
    fi
    sleep $((try * 10))
  done
  say "could not report the failure to the control plane; the boot deadline will release this machine"
  return 1
}

# The claim for the environment, once: written root-only as the agent's env file (one line,
# TENSORANT_BOOTSTRAP=<base64>) and the report's Authorization header. python3 is there wherever
# cloud-init is (cloud-init is Python). A refusal (401, 404, 409) is final: the claim was used.
exchange() {
  local try code answer
  answer=$(mktemp)
  for try in 1 2 3 4 5 6; do
    code=$(curl -sS --max-time 20 -o "$answer" -w '%{http_code}' -X POST -H 'Content-Type: application/json' \
      --data-binary '{"claim":"__CLAIM__"}' "$CLAIM_URL") || code=000
    if [ "$code" = 200 ] && (umask 077 && python3 - "$answer" __ENV_FILE__ __HEADER__ <<'PY'
import json, re, sys
got = json.load(open(sys.argv[1]))
blob, token = got["bootstrap"], got["token"]
assert re.fullmatch(r"[A-Za-z0-9+/=]+", blob) and re.fullmatch(r"[A-Za-z0-9._-]+", token)
open(sys.argv[2], "w").write("TENSORANT_BOOTSTRAP=" + blob + "\n")
open(sys.argv[3], "w").write("Authorization: Bearer " + token + "\n")
PY
    ); then
      rm -f "$answer"
      say "the machine's environment was received (claim exchanged)"
      return 0
    fi
    rm -f "$answer"
    case "$code" in
      401|403|404|409) say "the control plane refused the bootstrap claim (HTTP $code)"; return 1 ;;
    esac
    say "could not exchange the bootstrap claim (HTTP $code); retrying in $((try * 10)) s"
    sleep $((try * 10))
  done
  return 1
}
if [ ! -s __ENV_FILE__ ]; then
  exchange || { say "no environment: the boot deadline will release this machine"; exit 1; }
fi

pull() {
  local attempt=1 delay=__FIRST_DELAY__ code
  while :; do
    say "pulling $IMAGE (attempt $attempt of __ATTEMPTS__)"
    # Bounded: a pull that hangs (a registry that accepts and never answers) would hold the machine
    # until the boot deadline; `timeout` ends it (exit code 124) and it counts as a failed attempt.
    timeout __PULL_TIMEOUT__ docker pull "$IMAGE" 2>&1 | tee -a "$LOG"
    code=${PIPESTATUS[0]}
    [ "$code" -eq 0 ] && return 0
    if [ "$attempt" -ge __ATTEMPTS__ ]; then
      say "docker pull failed (exit code $code) after $attempt attempts"
      report pull "$code" "$attempt"
      exit "$code"
    fi
    say "docker pull failed (exit code $code); retrying in $delay s"
    sleep "$delay"
    attempt=$((attempt + 1))
    delay=$((delay * 2))
  done
}
# Started again (a reboot for a recovery): the image it ran is here; not pulled again.
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$IMAGE" ]; then
  say "$IMAGE was pulled on an earlier boot of this machine; not pulled again"
else
  pull
  echo "$IMAGE" >"$STAMP"
fi

# The container's output goes to the journal as it comes (this unit's output; docker keeps its own
# rotated copy); only its last lines are added to $LOG, for a failure's report: all of it would grow
# without bound.
keep_last() {
  python3 -c '
import collections, sys
last = collections.deque(maxlen=20)
for line in iter(lambda: sys.stdin.buffer.readline(4096), b""):
    sys.stdout.buffer.write(line)
    sys.stdout.buffer.flush()
    last.append(line.rstrip(b"\n") + b"\n")
with open(sys.argv[1], "ab") as log:
    log.writelines(last)
' "$LOG"
}

docker rm -f tensorant-train >/dev/null 2>&1 || true
say "starting the training container"
# --shm-size: torch's DataLoader workers share tensors through /dev/shm (docker's default is 64 MB).
# docker's own copy of the output is rotated (json-file, 3 x 50 MB).
docker run --name tensorant-train --gpus all --restart no --env-file __ENV_FILE__ -e TENSORANT_POWEROFF=exit \
  --shm-size __SHM_SIZE__ --log-driver json-file --log-opt max-size=50m --log-opt max-file=3 \
  -v "$DATA:__CONTAINER_DATA__" "$IMAGE" 2>&1 | keep_last
code=${PIPESTATUS[0]}
say "the training container exited with code $code"
if [ "$code" -eq __POWEROFF_EXIT__ ]; then
  # The agent stopped training by itself (its time is up, or its control plane is gone): power off,
  # keeping the disk. AWS stops the instance (InstanceInitiatedShutdownBehavior=stop); an Azure VM is
  # left stopped but allocated, still billed for compute until it is deallocated.
  say "the agent stopped by itself and asked for a poweroff; the disk is kept"
  poweroff
  exit 0
fi
# 0: stopped when idle; 143: stopped by the control plane (SIGTERM). A state file: the agent ran
# and reports for itself. Otherwise it never got going: report, so the run ends now.
if [ "$code" -ne 0 ] && [ "$code" -ne 143 ] && [ ! -e "$DATA/agent-state.json" ]; then
  stage=agent
  if [ "$code" -ge 125 ] && [ "$code" -le 127 ]; then stage=start; fi
  report "$stage" "$code" 1
fi
exit "$code"
"""

# The unit cloud-init writes; its runcmd enables it and starts it without waiting (render()).
_UNIT = """[Unit]
Description=Tensorant training container (the run's agent)
# Wanted, not required: without a Docker engine the script still runs, its pull fails and it reports that.
Wants=network-online.target docker.service
After=network-online.target docker.service

[Service]
Type=simple
ExecStart=__SCRIPT__
ExecStop=__SCRIPT__ stop
# The script retries the pull itself; a container that exited is not run again until the next boot.
Restart=no
SuccessExitStatus=143
StandardOutput=journal
StandardError=inherit
TimeoutStopSec=__STOP_TIMEOUT__

[Install]
# Every boot starts it again: a machine started again for a recovery runs the agent on its kept disk.
WantedBy=multi-user.target
"""


def report_url(env: dict[str, str]) -> str:
    return _agent_url(env, "boot-failed")


def claim_url(env: dict[str, str]) -> str:
    return _agent_url(env, "bootstrap")


def _agent_url(env: dict[str, str], what: str) -> str:
    url = f"{env['TENSORANT_API_URL'].rstrip('/')}/api/agent/runs/{env['TENSORANT_RUN_ID']}/{what}"
    _one_line(f"the {what} URL", url)
    return url


def _one_line(what: str, value: str) -> None:
    # Written into a YAML block and a bash script: a line break or a control character could add lines to either.
    if not value.isascii() or not value.isprintable():
        raise ValueError(f"{what} must be printable ASCII on one line")


def script(bootstrap: Bootstrap, claim: str) -> str:
    """The bash script the machine runs (cloud-init writes it to SCRIPT; the unit runs it at every boot)."""
    if not CLAIM_RE.fullmatch(claim):
        raise ValueError("the bootstrap claim must be 1-300 characters of A-Z a-z 0-9 . _ -")
    values = {
        "__IMAGE__": shlex.quote(bootstrap.container_image),
        "__CLAIM_URL__": shlex.quote(claim_url(bootstrap.env)), "__CLAIM__": claim,
        "__REPORT_URL__": shlex.quote(report_url(bootstrap.env)),
        "__PULL_TIMEOUT__": str(PULL_TIMEOUT_S), "__SHM_SIZE__": SHM_SIZE,
        "__DATA__": HOST_DATA_DIR, "__LOG__": BOOT_LOG, "__HEADER__": REPORT_HEADER_FILE,
        "__ENV_FILE__": ENV_FILE, "__CONTAINER_DATA__": CONTAINER_DATA_DIR,
        "__ATTEMPTS__": str(PULL_ATTEMPTS), "__FIRST_DELAY__": str(PULL_FIRST_DELAY_S),
        "__POWEROFF_EXIT__": str(POWEROFF_EXIT), "__UNIT_NAME__": UNIT_NAME, "__STAMP__": PULLED_STAMP,
        "__STOP_GRACE__": str(STOP_GRACE_S),
    }
    text = _SCRIPT
    for key, value in values.items():
        text = text.replace(key, value)
    return text


def unit() -> str:
    """The systemd unit that runs SCRIPT (cloud-init writes it to UNIT)."""
    return _UNIT.replace("__SCRIPT__", SCRIPT).replace("__STOP_TIMEOUT__", str(STOP_GRACE_S + 30))


def _indent(text: str) -> str:
    return "\n".join(("      " + line) if line else "" for line in text.rstrip("\n").splitlines())


REQUIRED = ("TENSORANT_RUN_ID", "TENSORANT_API_URL")  # the exchange's and the report's URLs


def render(bootstrap: Bootstrap, claim: str) -> str:
    """The user data: the script with the one-time claim it exchanges for the environment, the unit that
    runs it, and a runcmd that only enables and starts the unit (cloud-init's final stage does not wait for
    it). None of the environment's values (run token, storage access, Hugging Face token) is in it: user
    data stays readable through the metadata service for the machine's whole life."""
    missing = [k for k in REQUIRED if not bootstrap.env.get(k)]
    if missing:
        raise ValueError(f"the bootstrap has no {', '.join(missing)}")
    _one_line("the container image", bootstrap.container_image)
    text = (
        "#cloud-config\n"
        "write_files:\n"
        f"  - path: {SCRIPT}\n"
        "    permissions: '0700'\n"
        "    content: |\n"
        f"{_indent(script(bootstrap, claim))}\n"
        f"  - path: {UNIT}\n"
        "    permissions: '0644'\n"
        "    content: |\n"
        f"{_indent(unit())}\n"
        "runcmd:\n"
        "  - [systemctl, daemon-reload]\n"
        f"  - [systemctl, enable, {UNIT_NAME}]\n"
        f"  - [systemctl, start, --no-block, {UNIT_NAME}]\n"
    )
    if len(text.encode()) > MAX_USER_DATA:
        raise ValueError(f"user data is {len(text.encode())} bytes, over the 16 KB limit")
    return text
