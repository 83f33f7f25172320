"""`make run`: Azurite + the function app in the dev host on http://localhost:7071, local providers.

    python -m tensorant_devhost.run [--app function_app:app] [--port 7071] [--azurite-port 10000] [--no-azurite]
                                    [--verbose]

Azurite keeps its data in .tensorant/azurite, so a second run sees the first run's
tables and queues. An Azurite already listening on 10000-10002 is reused (and left
running); anything else on those ports stops the run with a message. Ctrl-C stops
the host and the Azurite this run started. The local provider's agent processes are
detached and outlive the host, as cloud machines outlive the control plane: the next
run finds them, and a run's release (or the sweeper) ends them; the shutdown names them.

The terminal shows the steps (queue messages), timers, warnings and errors; HTTP requests
only with --verbose or TENSORANT_LOG_REQUESTS=1 (`runs watch` and the agents poll often).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from tensorant_devhost.config import load_local_settings

AZURITE_PORTS = {"Blob": 10000, "Queue": 10001, "Table": 10002}
# The org of the token the banner prints: the one the README's quickstart uses (and `tensorant
# dev-token`'s default), so the printed token sees the quickstart's runs.
DEV_ORG = "demo"


def use_azurite_ports(blob: int) -> str:
    """Blob on `blob`, Queue and Table on the next two ports (a second checkout beside the
    first: `make run PORT=7081`, azurite_port_for); returns the connection string for them."""
    global AZURITE_PORTS
    AZURITE_PORTS = {"Blob": blob, "Queue": blob + 1, "Table": blob + 2}
    return _connection(AZURITE_PORTS)


def _connection(ports: dict[str, int]) -> str:
    from shared.settings import AZURITE

    conn = AZURITE
    for name, default in (("Blob", 10000), ("Queue", 10001), ("Table", 10002)):
        conn = conn.replace(f"{name}Endpoint=http://127.0.0.1:{default}/",
                            f"{name}Endpoint=http://127.0.0.1:{ports[name]}/")
    return conn


class RunError(Exception):
    """A reason `make run` cannot start, said so the user can fix it."""


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.3)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _azurite_server(port: int) -> str:
    """The Server header on a port ("Azurite-Queue/3.37.0"), or "" if it is not HTTP."""
    import requests

    try:
        return requests.get(f"http://127.0.0.1:{port}/devstoreaccount1?comp=list", timeout=2).headers.get("Server", "")
    except requests.RequestException:
        return ""


def _uses_local_azurite(conn: str) -> bool:
    queue = AZURITE_PORTS["Queue"]
    return not conn or conn.strip() == "UseDevelopmentStorage=true" or f"127.0.0.1:{queue}" in conn \
        or f"localhost:{queue}" in conn or "127.0.0.1:10001" in conn or "localhost:10001" in conn


# Which checkout an Azurite serves: a row in it, written by the run that started (or first reused) it. Two
# checkouts on one Azurite share every table and queue: one's sweep judged the other's runs.
CHECKOUT_TABLE = "tensorantdevhostcheckout"


def azurite_port_for(http_port: int) -> int:
    """Azurite's blob port when none is given: 10000 for the default 7071, and a checkout served on another
    port (`make run PORT=7081`) gets its own three ports (10000 + 10 x the offset: 10100-10102)."""
    port = 10000 + 10 * (http_port - 7071)
    return port if 1024 <= port <= 65000 else 10000


def claim_azurite(root: Path) -> None:
    """Record that the Azurite on AZURITE_PORTS serves `root`, or refuse (RunError) one that serves another
    checkout: its tables and queues would be shared with that checkout's host."""
    from azure.core.exceptions import ResourceExistsError
    from azure.data.tables import TableServiceClient

    table = TableServiceClient.from_connection_string(_connection(AZURITE_PORTS)).get_table_client(CHECKOUT_TABLE)
    try:
        table.create_table()
    except ResourceExistsError:
        pass
    mine = str(root.resolve())
    try:
        table.create_entity({"PartitionKey": "checkout", "RowKey": "root", "root": mine})
        return
    except ResourceExistsError:
        serves = str(table.get_entity("checkout", "root").get("root", ""))
    if serves != mine:
        ports = ", ".join(map(str, AZURITE_PORTS.values()))
        raise RunError(f"the Azurite on {ports} serves another checkout ({serves}): two checkouts on one Azurite share "
                       "every run, queue and table, and one's sweep judges the other's runs. Give this one its own: "
                       "make run PORT=7081 (its Azurite then uses 10100-10102), or AZURITE_PORT=<a free port>")


def ensure_azurite(root: Path) -> subprocess.Popen[bytes] | None:
    """Reuse an Azurite on the default ports or start one; return the process if this call started it.
    Either way it is claimed for this checkout (claim_azurite): another checkout's Azurite is refused."""
    busy = {name: port for name, port in AZURITE_PORTS.items() if _listening(port)}
    if busy:
        foreign = [f"{port} ({name})" for name, port in busy.items()
                   if not _azurite_server(port).startswith(f"Azurite-{name}")]
        if foreign or len(busy) != len(AZURITE_PORTS):
            taken = ", ".join(foreign or [f"{p} ({n})" for n, p in busy.items()])
            raise RunError(f"ports {taken} are in use by something that is not a complete Azurite. Stop it, "
                           "or set AzureWebJobsStorage in local.settings.json to the storage you want to use.")
        claim_azurite(root)
        print(f"Reusing the Azurite already listening on {', '.join(map(str, AZURITE_PORTS.values()))}", flush=True)
        return None
    data = root / ".tensorant" / "azurite"
    data.mkdir(parents=True, exist_ok=True)
    cmd = [azurite_bin(root), "--silent", "--skipApiVersionCheck", "--location", str(data)]
    for name, port in AZURITE_PORTS.items():
        cmd += [f"--{name.lower()}Host", "127.0.0.1", f"--{name.lower()}Port", str(port)]
    log = open(data / "azurite.log", "ab")  # noqa: SIM115 - lives as long as Azurite
    # Own session: Ctrl-C reaches only us, and we stop Azurite after the host is down.
    proc = subprocess.Popen(cmd, cwd=data, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RunError(f"Azurite exited at start (code {proc.returncode}); see {data / 'azurite.log'}")
        if all(_listening(p) for p in AZURITE_PORTS.values()):
            time.sleep(0.3)  # listening may be another Azurite that won the race; ours then exits
            if proc.poll() is not None:
                raise RunError(f"Azurite exited at start (code {proc.returncode}); see {data / 'azurite.log'}")
            try:
                claim_azurite(root)
            except Exception:
                proc.terminate()
                raise
            print(f"Started Azurite (data in {data})", flush=True)
            return proc
        time.sleep(0.1)
    stop_process(proc)
    raise RunError(f"Azurite did not listen within 30 s; see {data / 'azurite.log'}")


def azurite_bin(root: Path) -> str:
    """The Azurite executable: the repository's node_modules one, else one on PATH."""
    local = root / "node_modules" / ".bin" / "azurite"
    if local.exists():
        return str(local)
    found = shutil.which("azurite")
    if not found:
        raise RunError("Azurite is not installed: run `npm install` in the repository root (`make run` does it)")
    return found


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 8) -> None:
    """SIGTERM, then SIGKILL.

    Azurite can take half a minute to honour SIGTERM. Its database autosaves every 5 s, so
    once our writes stopped, waiting a little longer than that is enough to keep the data.
    """
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def set_local_defaults(root: Path, port: int) -> None:
    """App settings for running everything on this machine; what is already set wins."""
    from shared.settings import AZURITE

    defaults = {
        "AzureWebJobsStorage": AZURITE,
        "FUNCTIONS_WORKER_RUNTIME": "python",
        "TENSORANT_ENV": "development",
        "TENSORANT_DEPLOYMENT_ID": "dev",
        "TENSORANT_LOCAL_ROOT": str(root / ".tensorant" / "local"),
        "TENSORANT_PUBLIC_URL": f"http://localhost:{port}",
    }
    for key, value in defaults.items():
        if not os.environ.get(key):
            os.environ[key] = value


def log_requests(verbose: bool) -> bool:
    """Show every HTTP request (the host logs them at debug level) when --verbose or
    TENSORANT_LOG_REQUESTS is set; returns whether they are shown."""
    wanted = verbose or os.environ.get("TENSORANT_LOG_REQUESTS", "").strip().lower() in ("1", "true", "yes", "on")
    logging.getLogger("tensorant.devhost").setLevel(logging.DEBUG if wanted else logging.INFO)
    return wanted


def _rss_mb(pids: list[int]) -> int:
    """The resident memory of these processes together, in MB (from /proc; 0 for any gone meanwhile)."""
    kb = 0
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        kb += sum(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
    return round(kb / 1024)


DEFAULT_PORT = 7071  # the CLI's default URL is http://localhost:7071 (tensorant_cli.main)


def cli_prefix(org: str, port: int) -> str:
    """What a printed `tensorant ...` command needs before it to reach this host as that org: the URL on a
    port other than the CLI's default (without it the command answered `cannot reach http://localhost:7071`),
    a token for an org other than the dev token's."""
    url = "" if port == DEFAULT_PORT else f"TENSORANT_URL=http://localhost:{port} "
    token = "" if org == DEV_ORG else f"TENSORANT_TOKEN=$(tensorant dev-token --org {org}) "
    return url + token


def say_what_is_kept(port: int = DEFAULT_PORT) -> None:
    """At shutdown: the local agents that outlive this host, and why. A retained run's agent and
    trainer are stopped, not ended (a stopped machine whose disk is kept, for recovery) and hold
    their memory until the run is recovered or discarded. A running one is stopped the same way
    (paused): left running, it would train with nobody enforcing its runtime limit; the next host's
    heartbeat-check finds its heartbeat stale and retains it, and `recover --resume` continues it."""
    from shared.providers.base import RunRef
    from shared.providers.local.compute import LocalCompute, scan
    from shared.providers.local.config import LocalConfig
    from shared.settings import get_settings

    local = LocalCompute(LocalConfig(), get_settings())
    # list_managed: only this deployment's and this checkout's agents, never another's.
    agents = [r for r in local.list_managed() if r.kind == "process"]
    if not agents:
        return
    paused: set[str] = set()
    for agent in agents:
        if agent.state != "stopped":
            local.retain(RunRef(get_settings().deployment_id, agent.org, agent.run_id), [agent])
            paused.add(agent.run_id)
    if paused:
        agents = [r for r in local.list_managed() if r.kind == "process"]
    _, groups = scan()
    runs: dict[tuple[str, str], list[int]] = {}
    stopped: dict[tuple[str, str], bool] = {}
    for agent in agents:
        key = (agent.run_id, agent.org)
        runs.setdefault(key, []).extend(groups.get(int(agent.id), []))  # id: the process group
        stopped[key] = stopped.get(key, True) and agent.state == "stopped"
    print("Left behind by this stop (local agents outlive the host, as cloud machines outlive the "
          "control plane):", flush=True)
    for (run_id, org), pids in sorted(runs.items()):
        cli = cli_prefix(org, port) + "tensorant"
        if run_id in paused:
            print(f"  run {run_id} (org {org}): was running; its agent and trainer are stopped now ({_rss_mb(pids)} "
                  "MB of memory), so it trains no further with nobody enforcing its runtime limit. The next "
                  f"`make run` retains it; then `{cli} runs recover {run_id} --resume` trains on from its "
                  "last checkpoint")
        elif stopped[(run_id, org)]:
            print(f"  run {run_id} (org {org}): retained, its agent and trainer stopped, {_rss_mb(pids)} MB of "
                  f"memory: kept so its output can be recovered "
                  f"(`{cli} runs recover {run_id} --resume|--verify-saved|--upload FILE|--start-machine`)")
        else:
            print(f"  run {run_id} (org {org}): its agent could not be stopped ({_rss_mb(pids)} MB of memory): "
                  f"end it with `{cli} runs cancel {run_id} --discard --yes` after the next `make run`")
    retained = sorted(key for key, all_stopped in stopped.items() if all_stopped)
    if retained:
        print("To discard a retained run's machine and disk (with any output on them):")
        for run_id, org in retained:
            print(f"  {cli_prefix(org, port)}tensorant runs cancel {run_id} --discard --yes")
    sys.stdout.flush()


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        # As the HTTP server itself does: connections of a previous run in TIME_WAIT must not
        # make the port look busy (a second `make run` right after the first).
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tensorant_devhost.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--app", default="function_app:app", help="module:attr of the FunctionApp")
    parser.add_argument("--port", type=int, default=0, help="HTTP port (default: local.settings.json or 7071)")
    parser.add_argument("--azurite-port", type=int, default=int(os.environ.get("TENSORANT_AZURITE_PORT") or 0),
                        help="Azurite's blob port; queue and table use the next two (default 10000 for the HTTP "
                             "port 7071, its own ports for another: azurite_port_for)")
    parser.add_argument("--no-azurite", action="store_true", help="use AzureWebJobsStorage as it is")
    parser.add_argument("--verbose", "-v", action="store_true",
                        help="log every HTTP request too (or set TENSORANT_LOG_REQUESTS=1)")
    args = parser.parse_args(argv)
    log_requests(args.verbose)

    root = Path.cwd()
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    host_section = load_local_settings(root / "local.settings.json")
    port = args.port or int(host_section.get("LocalHttpPort") or 7071)
    azurite_conn = use_azurite_ports(args.azurite_port or azurite_port_for(port))
    if not _port_free(port):
        print(f"error: port {port} is in use (another `make run`?). Stop it, or pass --port.", file=sys.stderr)
        return 1

    azurite: subprocess.Popen[bytes] | None = None
    host = None
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    try:
        if not args.no_azurite and _uses_local_azurite(os.environ.get("AzureWebJobsStorage", "")):
            azurite = ensure_azurite(root)
            os.environ["AzureWebJobsStorage"] = azurite_conn
        set_local_defaults(root, port)
        from shared.settings import get_settings, reset_settings

        reset_settings()
        try:
            production = get_settings().is_production
        except ValueError as exc:
            if os.environ.get("TENSORANT_ENV", "").strip().lower() != "production":
                raise RunError(f"the app settings are not valid: {exc}") from exc
            production = True  # production settings that fail their checks
        if production:
            raise RunError("the dev host is for development only and refuses TENSORANT_ENV=production; "
                           "deploy the function app to Azure Functions instead")

        from shared import queues
        from shared.providers.local.compute import protect_host
        from tensorant_devhost.host import Host
        from tensorant_devhost.invocation import notify

        # Before the HTTP workers are forked (they inherit it): the local provider's agents and
        # trainers run as this user and must not read this host's environment (the JWT secret).
        protect_host()

        # Wake our pollers at once for in-process sends (the real host's SharedQueueWatcher
        # does this for output bindings).
        queues.configure(on_send=[notify])

        # As the Functions host: FUNCTIONS_WORKER_PROCESS_COUNT worker processes (1-10, default 1).
        raw = os.environ.get("FUNCTIONS_WORKER_PROCESS_COUNT") or "1"
        if not raw.isdigit() or not 1 <= int(raw) <= 10:
            raise RunError(f"FUNCTIONS_WORKER_PROCESS_COUNT is {raw!r}: set a whole number from 1 to 10")
        workers = int(raw)
        try:
            host = Host(args.app, root=root, port=port, cors=cors_origins(host_section.get("CORS"), port),
                        http_workers=workers, credentials_first=True).start()
        except (ImportError, AttributeError, ValueError) as exc:
            raise RunError(f"cannot load the function app {args.app!r}: {type(exc).__name__}: {exc}") from exc
        _banner(host, port)
        while not stopping.is_set():
            stopping.wait(0.5)
        print("\nStopping...", flush=True)
        return 0
    except RunError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        if host is not None:
            host.stop()
            try:
                say_what_is_kept(port)
            except Exception as exc:  # a report: it must not keep Azurite from being stopped below
                print(f"(could not list the local agents this host leaves behind: {exc})", flush=True)
        if azurite is not None:
            print("Stopping Azurite (it saves its data; up to 8 s)...", flush=True)
            stop_process(azurite)


def cors_origins(configured: str | None, port: int) -> str:
    """The browser origins allowed to call this host: the local ones of its own docs page unless
    local.settings.json's Host.CORS lists others. Never "*": the development JWT secret is public,
    so any web page a developer visits could otherwise mint a token and drive their control plane."""
    origins = [o.strip() for o in (configured or "").split(",") if o.strip()]
    if "*" in origins:
        raise RunError('local.settings.json sets Host.CORS to "*": any web page could then use this control '
                       "plane (the development token secret is public); list the origins instead, e.g. "
                       f"http://localhost:{port}")
    return ",".join(origins or [f"http://localhost:{port}", f"http://127.0.0.1:{port}"])


def _banner(host: object, port: int) -> None:
    from shared.models import Role
    from shared.security import mint_user_token
    from shared.settings import get_settings
    from tensorant_devhost.functions import resolve_setting

    # Never a token minted with production settings (main refuses production anyway).
    token = "" if get_settings().is_production else mint_user_token("dev-user", DEV_ORG, Role.owner)
    functions = getattr(host, "functions", [])
    lines = [f"  {f.name}: [{f.kind}] " + (
        f"/api/{f.route.template}" if f.route else f.queue_name or resolve_setting(f.schedule))
             for f in functions]
    base = f"http://localhost:{port}"
    print("\nFunctions:\n" + "\n".join(lines), flush=True)
    auth = (f"Dev owner token (org {DEV_ORG}, as in the README's quickstart; `tensorant dev-token --org ORG` "
            "mints others):\n"
            f"  export TENSORANT_URL={base}\n  export TENSORANT_TOKEN={token}" if token else
            f"  export TENSORANT_URL={base}  (production settings: no dev token is printed)")
    # One URL, the one TENSORANT_URL takes (the CLI adds /api itself, and accepts it given).
    print(f"\nTensorant control plane: {base}\nWeb console: {base}/api/console (sign in with the token below)\n"
          f"API docs: {base}/api/docs\n{auth}\n\nPress Ctrl-C to stop.", flush=True)


if __name__ == "__main__":
    sys.exit(main())
