"""The contract's own checks: the bootstrap check (tests/providers/contract.check_handed) on cloud-init user
data, which must pass what AWS and Azure send and fail what would leave the machine without its agent; the
contract calls every Protocol method; CloudContract fails a provider on an in-memory fake."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.providers import bootstrap_env, cloudinit
from shared.providers.base import Bootstrap, LaunchSpec, RunRef
from tests.fakes import OFFER
from tests.providers.contract import Handed, check_handed

REF = RunRef("test", "org-1", "run-check")
SPEC = LaunchSpec(ref=REF, offer=OFFER, bootstrap=Bootstrap(
    container_image="ghcr.io/tensorant/trainer:1",
    env={"TENSORANT_RUN_ID": REF.run_id, "TENSORANT_API_URL": "https://cp.example.com",
         "TENSORANT_RUN_TOKEN": "tok-secret-check"}))


def _rendered(ref: RunRef = REF, bootstrap: Bootstrap = SPEC.bootstrap) -> str:
    return cloudinit.render(bootstrap, bootstrap_env.claim(ref.org, ref.run_id))


def test_the_user_data_a_cloud_init_launch_renders_passes() -> None:
    check_handed(Handed(user_data=_rendered()), SPEC)


@pytest.mark.parametrize(("user_data", "caught"), [
    (None, "neither user data nor an environment"),
    ("", "not a cloud-config"),
    ("#cloud-config\nruncmd: [true]\n", "writes no /usr/local/bin/tensorant-train"),
    (_rendered(ref=RunRef("test", "org-1", "run-other")), "not the bootstrap script"),
    (_rendered(bootstrap=Bootstrap("busybox", SPEC.bootstrap.env)), "not the bootstrap script"),
    (_rendered() + "# tok-secret-check\n", "holds the values of \\['TENSORANT_RUN_TOKEN'\\]"),
], ids=["nothing", "empty", "no-script", "another-runs-claim", "another-image", "the-token"])
def test_the_check_fails_user_data_without_the_runs_bootstrap(user_data: str | None, caught: str) -> None:
    with pytest.raises(AssertionError, match=caught):
        check_handed(Handed(user_data=user_data), SPEC)


def test_the_contract_calls_every_method_of_the_protocol() -> None:
    # Each method of ComputeProvider is called on the provider under test somewhere in the contract, so a
    # skeleton's NotImplementedError in any of them fails it (the contract once never called start, scope,
    # validate or offers, and a describe of a missing machine).
    import ast
    import inspect

    from shared.providers.base import ComputeProvider
    from tests.providers import contract

    protocol = {n for n, v in vars(ComputeProvider).items() if inspect.isfunction(v) and not n.startswith("_")}
    called = {node.func.attr for node in ast.walk(ast.parse(inspect.getsource(contract)))
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "provider"}
    assert protocol and protocol <= called, f"the contract never calls {sorted(protocol - called)}"


def test_socket_writes_sees_a_loopback_server_and_not_a_dict_in_memory() -> None:
    # What CloudContract tells a provider on its fake cloud's wire from one on an in-memory fake by.
    import threading
    import urllib.request
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from shared.settings import Settings
    from tests.fakes import Cloud, MemoryCompute, MemoryConfig
    from tests.providers.contract import _loopback, socket_writes

    class Ok(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with socket_writes() as seen:
            MemoryCompute(MemoryConfig(), Settings(deployment_id="test"),
                          Cloud()).launch(SPEC)
        assert seen == []
        with socket_writes() as seen:
            urllib.request.urlopen(f"http://127.0.0.1:{server.server_address[1]}/", timeout=10).close()
        assert seen and all(_loopback(a) for a in seen), seen
        assert not _loopback(("10.0.0.1", 443)) and not _loopback(("unconnected", 0))
    finally:
        server.shutdown()
        server.server_close()


POSING = '''
from contextlib import contextmanager

import pytest

import tests.providers.memory.test_contract as memory
from shared.errors import PermanentError
from tests.providers.contract import RAISED, CloudContract


class TestInMemoryCloud(CloudContract, memory.TestMemoryContract):
    """The in-memory fake under a registered cloud's name, refusing with that cloud's error classes itself."""

    @pytest.fixture(autouse=True)
    def posing_as_a_cloud(self, provider_env):
        provider_env.provider.name = "runpod"  # a registered cloud: its error table, no dev_only
        cloud = provider_env.provider.cloud

        @contextmanager
        def refuse(kind, code):
            cloud.launch_error = RAISED.get(kind, PermanentError)(code)
            try:
                yield
            finally:
                cloud.launch_error = None

        provider_env.refuse = refuse
'''


def test_cloud_contract_fails_a_provider_on_an_in_memory_fake(tmp_path: Path) -> None:
    # The skeleton: every promise kept on a dict in memory, refusals raised as the right classes
    # without a wire. The Protocol's tests pass; the wire's fail.
    import subprocess
    import sys
    import xml.etree.ElementTree as ET

    root = Path(__file__).resolve().parents[2]
    (tmp_path / "test_posing.py").write_text(POSING)
    report = tmp_path / "report.xml"
    subprocess.run([sys.executable, "-m", "pytest", str(tmp_path / "test_posing.py"), "-p", "no:cacheprovider",
                    f"--junitxml={report}"], cwd=root, capture_output=True, text=True, timeout=300, check=False)
    outcome = {c.get("name", ""): next(((child.tag, child.get("message", "")) for child in c
                                        if child.tag in ("failure", "error", "skipped")), ("passed", ""))
               for c in ET.parse(report).getroot().iter("testcase")}
    failed = {n: m for n, (o, m) in outcome.items() if o in ("failure", "error")}
    assert set(failed) == {"test_the_provider_reaches_its_fake_cloud_over_loopback",
                           *(f"test_each_code_of_the_error_table_is_translated_from_the_wire[{k}]"
                             for k in ("capacity", "auth", "not_found", "throttled"))}, outcome
    assert "wrote nothing to any socket" in failed["test_the_provider_reaches_its_fake_cloud_over_loopback"]
    assert "over loopback" in failed["test_each_code_of_the_error_table_is_translated_from_the_wire[capacity]"]
    assert outcome["test_launch_twice_is_one_machine"][0] == "passed"  # the Protocol's promises alone pass
