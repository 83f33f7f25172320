"""shared/providers/lazy.py: an SDK adaptor imports nothing until used, and a missing SDK says which
package to install (a PermanentError), also when only a namespace package of its name is installed."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.errors import PermanentError
from shared.providers.lazy import LazyImport

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def namespace_only(tmp_path: Path) -> Iterator[str]:
    """A namespace package `tns_cloud` (a folder without __init__.py, as `azure` or `google` with only another
    distribution of the family installed) on sys.path; its `compute_v1` is not installed."""
    (tmp_path / "tns_cloud" / "storage").mkdir(parents=True)
    (tmp_path / "tns_cloud" / "storage" / "__init__.py").write_text("")
    sys.path.insert(0, str(tmp_path))
    try:
        yield "tns_cloud"
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m == "tns_cloud" or m.startswith("tns_cloud.")]:
            del sys.modules[name]


def test_a_missing_sdk_says_what_to_install() -> None:
    sdk = LazyImport("tensorant_no_such_sdk.compute", "tensorant-no-such-sdk", needed_by="the nocloud provider")
    with pytest.raises(PermanentError, match=r"the nocloud provider needs the Python package tensorant-no-such-sdk.*"
                                             r"pip install tensorant-no-such-sdk") as caught:
        sdk.ComputeClient  # noqa: B018
    assert caught.value.code == "sdk_missing"


def test_a_namespace_package_alone_is_a_missing_sdk_not_an_attribute_error(namespace_only: str) -> None:
    # `import tns_cloud` works (a namespace package), so the plain lazy `import tns_cloud` of a provider
    # and `tns_cloud.compute_v1.Client` failed with "module 'tns_cloud' has no attribute 'compute_v1'".
    __import__(namespace_only)
    with pytest.raises(AttributeError, match="has no attribute 'compute_v1'"):
        sys.modules[namespace_only].compute_v1  # noqa: B018
    for adaptor in (LazyImport("tns_cloud.compute_v1", "tns-cloud-compute"), LazyImport("tns_cloud", "tns-cloud-compute")):
        with pytest.raises(PermanentError, match="pip install tns-cloud-compute"):
            adaptor.compute_v1.Client  # noqa: B018


def test_an_adaptor_imports_on_first_use_and_reaches_submodules() -> None:
    # In a fresh interpreter: declaring the adaptor imports nothing; the first attribute imports the module,
    # and a submodule the package does not import itself is imported on access (email.mime is not in email).
    code = ("import sys; from shared.providers.lazy import LazyImport; email = LazyImport('email', 'stdlib'); "
            "before = 'email' in sys.modules; mime = email.mime; "
            "print(before, 'email' in sys.modules, mime.__name__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True", "email.mime"]
    with pytest.raises(AttributeError, match="no attribute or submodule 'no_such_part'"):
        LazyImport("email", "stdlib").no_such_part  # noqa: B018


@pytest.mark.parametrize(("hidden", "call", "package"), [
    ("runpod", "from shared.providers.runpod import client; client.stop_mutation('abc123')", "runpod"),
    ("azure.mgmt.compute", "from shared.providers.azure import sdk; sdk.mgmt_compute.ComputeManagementClient",
     "azure-mgmt-compute"),
    ("boto3", "from shared.providers.aws.client import AwsClient; from shared.providers.aws.config import AwsConfig; "
              "AwsClient(AwsConfig.model_validate({'region': 'us-east-1', 'access_key_id': 'AKIAIOSFODNN7EXAMPLE', "
              "'secret_access_key': 'x' * 40, 'ami_id': 'ami-0123456789abcdef0', 'subnet_id': 'subnet-0123456789abcdef0', "
              "'security_group_id': 'sg-0123456789abcdef0'})).client('ec2')", "boto3"),
], ids=["runpod", "azure", "aws"])
def test_a_provider_without_its_sdk_says_what_to_install(hidden: str, call: str, package: str) -> None:
    # sys.modules[name] = None makes `import name` fail as if it were not installed.
    code = (f"import sys; sys.modules[{hidden!r}] = None\n"
            f"try:\n    {call}\nexcept Exception as exc:\n    print(type(exc).__name__, exc.reason)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("PermanentError ") and f"pip install {package}`" in out.stdout, out.stdout
