"""Time to recover after a host is killed mid-step (kill -9): how long its message stays lost.

Run: .venv/bin/python -m tests.bench.crash_recover_bench  [--lease 600] [--step 20]

A dev host (tools/devhost) runs in its own process on a real Azurite with the sample app of
tests/devhost_app, whose queue function sleeps for --step seconds. Once the host holds the
message, it is killed with SIGKILL (no cleanup); a second host then polls the same queue, and
the bench reports the seconds from the kill until the second host runs the message. The
running message is leased as the Functions host leases it (10 minutes, renewed at half), so the
message is lost for the rest of the lease: 5 to 10 minutes on Azure, the default here (the
bench then runs that long). `--lease 20` checks the same mechanism in under a minute.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import sys, time
from tensorant_devhost import Host, HostConfig
Host("tests.devhost_app.app:app", root=sys.argv[1], http=False, timers=False,
     config=HostConfig(processing_lease_s=int(sys.argv[2]), max_polling_interval_s=0.2)).start()
while True:
    time.sleep(1)
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lease", type=int, default=600,
                        help="the processing lease, seconds (600: the Functions host's, renewed at half)")
    parser.add_argument("--step", type=float, default=20.0, help="how long the step runs, seconds")
    args = parser.parse_args()
    sys.path[:0] = [str(ROOT), str(ROOT / "tools" / "devhost")]
    from azure.storage.queue import QueueClient

    from tensorant_devhost import Host, HostConfig
    from tests.azurite import Azurite
    from tests.devhost_app import app as sample

    azurite = Azurite().start()
    work = Path(tempfile.mkdtemp(prefix="crash-bench-"))
    (work / "host.json").write_text(json.dumps({"version": "2.0", "extensions": {"queues": {
        "batchSize": 1, "maxDequeueCount": 5, "visibilityTimeout": "00:00:00", "messageEncoding": "base64"}}}))
    queue = "crash-" + secrets.token_hex(4)
    env = {**os.environ, "AzureWebJobsStorage": azurite.connection_string, "DEVHOST_QUEUE": queue,
           "DEVHOST_TIMER": "0 0 0 1 1 *", "PYTHONPATH": f"{ROOT}:{ROOT / 'tools' / 'devhost'}"}
    os.environ.update({k: env[k] for k in ("AzureWebJobsStorage", "DEVHOST_QUEUE", "DEVHOST_TIMER")})
    client = QueueClient.from_connection_string(azurite.connection_string, queue)
    client.create_queue()
    client.send_message(base64.b64encode(f"sleep:{args.step}".encode()).decode())
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(work), str(args.lease)], cwd=ROOT, env=env)
    second = None
    try:
        while list(client.peek_messages(max_messages=1)):  # the first host takes it
            time.sleep(0.05)
        taken = time.monotonic()
        time.sleep(2)  # mid-step
        os.kill(child.pid, signal.SIGKILL)
        killed = time.monotonic()
        child.wait()
        # Killed this long after its last renewal (at 0 and every lease/2): what is left of the lease.
        held = (time.monotonic() - taken) % (args.lease / 2)
        print(f"host killed mid-step (lease {args.lease} s, renewed every {args.lease / 2:g} s, last renewal "
              f"{held:.1f} s before the kill, step {args.step:g} s); waiting for a second host...")
        second = Host("tests.devhost_app.app:app", root=work, http=False, timers=False,
                      config=HostConfig(processing_lease_s=args.lease))
        sample.reset()

        def poll() -> None:
            while not sample.CALLS:
                second.pump(max_messages=1)
                time.sleep(0.2)

        threading.Thread(target=poll, daemon=True).start()
        while not sample.CALLS:  # recorded when the function starts, before its sleep
            time.sleep(0.05)
        recovered = time.monotonic() - killed
        print(f"time to recover after kill -9: {recovered:.1f} s until a second host started the step again "
              f"(expected: the lease's rest, {args.lease - held:.1f} s; on Azure 300-600 s)")
    finally:
        if second is not None:
            second.stop()  # its invocation pool: the process hung after its report, until killed
        if child.poll() is None:
            child.kill()
        azurite.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
