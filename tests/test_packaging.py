"""Packaging facts: requirements.txt matches pyproject, importing the app loads no cloud SDK and no
tool, and the agent and the CLI import in a bare virtual environment (their own files only)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import pytest

from shared.providers.lazy import LazyImport

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ("tensorant_cli", "tensorant_client", "tensorant_devhost", "croniter")
# The control plane's own heavy libraries, which the CLI must not declare either (besides every provider SDK).
APP_HEAVY = {"numpy", "pydantic", "pydantic-core"}
# The plain HTTP client: an adaptor of the providers that call HTTPS APIs themselves, and the CLI's one dependency.
PLAIN_HTTP = "requests"


def _lock(text: str | None = None) -> dict[str, str]:
    """name -> version of requirements.txt (or `text`); a pin without its --hash lines fails: the deployment
    installs in hash-checking mode, where one unhashed pin fails the whole install (`make lock` writes them)."""
    pins: dict[str, str] = {}
    hashed: dict[str, bool] = {}
    name = ""
    for line in (ROOT / "requirements.txt").read_text().splitlines() if text is None else text.splitlines():
        line = line.split("#", 1)[0].strip().removesuffix("\\").strip()
        if line.startswith("--hash="):  # a pin's hashes follow it (tests/test_supply_chain.py)
            assert name, f"a hash before any pin: {line!r}"
            hashed[name] = True
            continue
        if not line:
            continue
        raw, sep, version = line.partition("==")
        assert sep and version and not any(c in version for c in "<>=!~*,; "), f"not pinned exactly: {line!r}"
        name = re.sub(r"[-_.]+", "-", raw).lower()
        pins[name], hashed[name] = version, False
    unhashed = sorted(n for n, ok in hashed.items() if not ok)
    assert not unhashed, f"requirements.txt pins {unhashed} without --hash lines: run `make lock`"
    return pins


def test_the_lock_check_refuses_a_pin_without_hashes() -> None:
    good = "a==1 \\\n    --hash=sha256:" + "0" * 64 + "\n    # via b\n"
    assert _lock(good) == {"a": "1"}
    with pytest.raises(AssertionError, match=r"pins \['b'\] without --hash lines"):
        _lock(good + "b==2\n    # via a\n")
    with pytest.raises(AssertionError, match="not pinned exactly"):
        _lock(good + "c>=2 \\\n    --hash=sha256:" + "1" * 64 + "\n")


def test_requirements_txt_is_a_current_lock_of_pyproject() -> None:
    # Azure's remote build installs requirements.txt: every package pinned (reproducible deployments),
    # and each of pyproject's dependencies present at a version its range admits (`make lock` when not).
    from packaging.requirements import Requirement

    pins = _lock()
    for dep in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]:
        req = Requirement(dep)
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        assert name in pins, f"{req.name} is in pyproject.toml but not in requirements.txt: run `make lock`"
        assert req.specifier.contains(pins[name], prereleases=True), \
            f"requirements.txt pins {req.name}=={pins[name]}, outside pyproject's {req.specifier}: run `make lock`"
    assert "torch" not in pins  # the trainer's dependencies are the image's, never the app's


def _distribution_of(module: str) -> str:
    """The installed distribution whose files hold `module` (azure.mgmt.compute -> azure-mgmt-compute)."""
    from importlib.metadata import distribution, packages_distributions

    parts = module.split(".")
    wanted = {"/".join(parts) + "/__init__.py", "/".join(parts) + ".py"}
    for name in packages_distributions().get(parts[0], []):
        if any(str(f) in wanted for f in distribution(name).files or []):
            return re.sub(r"[-_.]+", "-", name).lower()
    raise AssertionError(f"no installed distribution holds {module}: install the provider's SDK in the dev venv")


def _sdk_adaptors() -> dict[str, list[LazyImport]]:
    """Provider name -> the adaptors its sdk.py declares ([] for a provider without an SDK)."""
    from shared.providers import lazy
    from shared.providers.registry import providers

    out: dict[str, list[LazyImport]] = {}
    for name in providers():
        found = importlib.util.find_spec(f"shared.providers.{name}.sdk")
        out[name] = lazy.adaptors_of(importlib.import_module(f"shared.providers.{name}.sdk")) if found else []
    return out


def test_every_provider_sdk_is_importable_and_in_both_requirement_files() -> None:
    # A provider's SDK missing from pyproject breaks `pip install .`; missing from requirements.txt it is
    # absent on Azure (the remote build installs only the lock) and the provider fails at its first call.
    from importlib.metadata import requires

    from shared.providers import lazy
    from shared.providers.registry import providers

    adaptors = _sdk_adaptors()
    for name, info in providers().items():  # the registry's list is the adaptors', never kept by hand
        expected = lazy.modules_of(importlib.import_module(f"shared.providers.{name}.sdk")) if adaptors[name] else ()
        assert info.sdk_modules == expected, f"{name}: ProviderInfo(sdk_modules=modules_of(sdk)), from its sdk.py"
    named = {a.module_name: (name, a) for name, found in adaptors.items() for a in found}
    imported = subprocess.run([sys.executable, "-c", "import " + ", ".join(named)], cwd=ROOT, capture_output=True,
                              text=True, timeout=120, check=False)
    assert imported.returncode == 0, f"a provider SDK does not import in the dev venv: {imported.stderr[-1500:]}"
    declared = {re.sub(r"[-_.]+", "-", _requirement_name(d)).lower()
                for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]}
    # A module of a distribution that a declared one requires (azure-core, of azure-identity) is installed with it.
    brought = {re.sub(r"[-_.]+", "-", _requirement_name(r)).lower() for d in declared for r in requires(d) or []
               if "extra ==" not in r}
    pins = _lock()
    for module, (provider, adaptor) in named.items():
        dist = _distribution_of(module)
        assert dist == re.sub(r"[-_.]+", "-", adaptor.distribution).lower(), \
            f"{provider}'s adaptor of {module} names {adaptor.distribution} in its install hint; it is in {dist}"
        assert dist in declared | brought, f"{provider} imports {module} ({dist}): add {dist} to pyproject.toml"
        assert dist in pins, f"{provider} imports {module} ({dist}): run `make lock` to pin it in requirements.txt"
        # A namespace package (azure, google.cloud) imports with none of the SDK in it: name the module with the code.
        assert importlib.import_module(module).__file__, f"{provider}: {module} is a namespace package"
    assert "botocore.config" in named and _distribution_of("azure.mgmt.compute") == "azure-mgmt-compute"


# What a provider package may import directly: the app's own packages and its model library. Anything else is
# an SDK, imported through an adaptor of the package's sdk.py.
APP_IMPORTS = {"shared", "machine", "adapter_format", "pydantic"}


def _direct_sdk_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        found += [f"{where}:{node.lineno}: {n}" for n in names
                  if n.split(".")[0] not in APP_IMPORTS | set(sys.stdlib_module_names)]
    return found


def test_a_provider_imports_its_sdk_only_through_its_adaptors(tmp_path: Path) -> None:
    # A module imported directly (at the top of a module, or in a function) is in no sdk_modules list: the
    # import-time test below would not see it loaded, nor the requirement test above check its distribution.
    offences = [hit for path in sorted((ROOT / "shared" / "providers").glob("*/*.py")) for hit in _direct_sdk_imports(path)]
    assert offences == [], "import these through a LazyImport in the package's sdk.py:\n" + "\n".join(offences)
    # The check itself: a direct import, at the top or inside a function, is found; the app's own are not.
    probe = tmp_path / "client.py"
    probe.write_text("import json\nfrom pydantic import BaseModel\nfrom shared.providers.gcp import sdk\n"
                     "import google.auth\ndef f():\n    from google.cloud import compute_v1\n")
    assert [hit.rsplit(" ", 1)[-1] for hit in _direct_sdk_imports(probe)] == ["google.auth", "google.cloud"]


def test_import_function_app_loads_no_provider_sdk() -> None:
    from shared.providers.registry import sdk_modules

    code = (f"import sys, function_app; sdks = {tuple(sdk_modules())!r}; "
            "print(','.join(sorted(m for m in sys.modules if any(m == s or m.startswith(s + '.') for s in sdks))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""



def test_import_function_app_loads_no_telemetry_distro() -> None:
    # azure-monitor-opentelemetry is the Python worker's to configure (PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY):
    # the app uses only the OpenTelemetry API, lazily (shared/metrics.py), and the distro's instrumentations
    # (django, flask, fastapi, ...) would slow every cold start.
    code = ("import sys, json, function_app; print(json.dumps(sorted(m for m in sys.modules "
            "if m.startswith(('azure.monitor', 'opentelemetry.instrumentation', 'opentelemetry.sdk')))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []
    assert "azure-monitor-opentelemetry" in _lock()


def test_requirements_txt_holds_no_tool_dependency() -> None:
    assert "croniter" not in _lock()


def test_azure_functions_doctor_finds_no_failure() -> None:
    # Its remaining warnings are explained in README ("Deploying"); a failure is a deployment that breaks.
    doctor = Path(sys.executable).parent / "azure-functions-doctor"
    assert doctor.exists(), "azure-functions-doctor is missing: install the dev extras"
    # On the project's own files (what git tracks), not on what a checkout gathers beside them: it walks
    # every folder, and `make vm-check` keeps a whole Debian root filesystem under .tensorant/.
    tree = Path(tempfile.mkdtemp(prefix="doctor-"))
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, tracked.decode().split("\0")):
        if (ROOT / name).is_file():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, tree / name)
    try:
        done = subprocess.run([str(doctor), "doctor", "--path", str(tree), "--format", "json"], capture_output=True,
                              text=True, timeout=300)
    finally:
        shutil.rmtree(tree, ignore_errors=True)
    report = json.loads(done.stdout)
    items = [item for section in report["results"] for item in section["items"]]
    failed = [f"{i['rule_id']}: {i['value']}" for i in items if i["status"] == "fail"]
    assert not failed, failed
    warned = sorted(i["rule_id"] for i in items if i["status"] == "warn")
    readme = (ROOT / "README.md").read_text()
    assert [w for w in warned if w not in readme] == [], "explain each azure-functions-doctor warning in README"


def test_import_function_app_loads_no_tool_module() -> None:
    # The tools are importable here, so an import of one from the app would succeed and show.
    code = ("import sys, json, function_app; "
            f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {TOOLS!r})))")
    env = {"PATH": "", "PYTHONPATH": f"{ROOT}:{ROOT / 'tools' / 'cli'}:{ROOT / 'tools' / 'devhost'}"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def _requirement_name(req: str) -> str:
    return re.split(r"[\s<>=!~;\[]", req.strip(), maxsplit=1)[0]


def test_the_cli_declares_no_cloud_sdk_numpy_or_pydantic() -> None:
    project = tomllib.loads((ROOT / "tools" / "cli" / "pyproject.toml").read_text())["project"]
    names = [_requirement_name(r) for r in project["dependencies"]]
    for extra in (project.get("optional-dependencies") or {}).values():
        names += [_requirement_name(r) for r in extra]
    assert names and not [n for n in names if _heavy(n)], names
    assert project["scripts"]["tensorant"] == "tensorant_cli.main:main"
    # The suite checks the heavy set itself, so an empty one cannot make this pass; every provider's SDK is in it
    # by its adaptors, so a new provider's SDK needs no edit here.
    assert all(_heavy(n) for n in ("boto3", "botocore", "azure-mgmt-compute", "azure-data-tables", "runpod", "numpy",
                                   "pydantic"))
    assert not _heavy(PLAIN_HTTP)
    # Its HTTP code is tensorant_client's, which declares requests and pydantic (its typed models) and nothing
    # heavier; the CLI never imports those models (test_the_cli_imports_with_the_standard_library_alone).
    client = tomllib.loads((ROOT / "tools" / "client" / "pyproject.toml").read_text())["project"]
    assert "tensorant-client" in names
    assert sorted(_requirement_name(r) for r in client["dependencies"]) == ["pydantic", "requests"]


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _heavy(name: str) -> bool:
    """A distribution the thin CLI must not declare: a provider SDK (its adaptors' distributions), the Azure SDK
    family (the app's storage and Functions SDKs too), or one of the app's heavy libraries."""
    sdks = {_norm(a.distribution) for found in _sdk_adaptors().values() for a in found} - {PLAIN_HTTP}
    return _norm(name) in sdks | APP_HEAVY or _norm(name).startswith("azure-")


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtual environment with nothing installed (no pip either)."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    return venv / "bin" / "python"


# Run with -I (isolated: no PYTHONPATH, no user site, not the current directory): it imports
# the package from `root`, lists every loaded module that is not the standard library or the
# package itself, then runs the package's `--help`.
_PROBE = """
import importlib.util, json, runpy, sys
root, package, main = sys.argv[1:4]
assert importlib.util.find_spec("pydantic") is None, "the environment is not bare"
sys.path.insert(0, root)
module = __import__(main, fromlist=["main"])
allowed = {"__main__", *package.split(",")}
foreign = sorted(m for m in sys.modules
                 if m.split(".")[0] not in sys.stdlib_module_names and m not in allowed
                 and not any(m.startswith(p + ".") for p in allowed))
print(json.dumps(foreign))
sys.stdout.flush()
module.main(["--help"])
"""


def _probe(python: Path, root: Path, package: str, main: str) -> tuple[list[str], str]:
    result = subprocess.run([str(python), "-I", "-c", _PROBE, str(root), package, main],
                            capture_output=True, text=True, timeout=120, check=False, env={"PATH": ""})
    assert result.returncode == 0, result.stderr
    first, _, rest = result.stdout.partition("\n")
    return json.loads(first), rest


def _copy_py(src: Path, dest: Path) -> None:
    for path in src.rglob("*.py"):  # subpackages too (tensorant_cli.commands)
        target = dest / path.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)


def test_the_agent_runs_with_the_standard_library_and_its_own_files(bare_python: Path, tmp_path: Path) -> None:
    (tmp_path / "machine").mkdir()
    shutil.copyfile(ROOT / "machine" / "__init__.py", tmp_path / "machine" / "__init__.py")
    _copy_py(ROOT / "machine" / "agent", tmp_path / "machine" / "agent")
    foreign, help_text = _probe(bare_python, tmp_path, "machine.agent,machine", "machine.agent.main")
    assert foreign == []
    assert "usage: python -m machine.agent" in help_text and "TENSORANT_BOOTSTRAP" in help_text


def test_the_cli_imports_with_the_standard_library_alone(bare_python: Path, tmp_path: Path) -> None:
    # With tensorant_client, its HTTP code: the CLI loads that package's transport, never its models (pydantic).
    _copy_py(ROOT / "tools" / "cli" / "tensorant_cli", tmp_path / "tensorant_cli")
    _copy_py(ROOT / "tools" / "client" / "tensorant_client", tmp_path / "tensorant_client")
    foreign, help_text = _probe(bare_python, tmp_path, "tensorant_cli,tensorant_client", "tensorant_cli.main")
    assert foreign == []
    assert "usage: tensorant" in help_text
    # The one command that needs the control plane's code says so instead of a traceback.
    code = "import sys; sys.path.insert(0, sys.argv[1]); from tensorant_cli.main import main; sys.exit(main(['dev-token']))"
    result = subprocess.run([str(bare_python), "-I", "-c", code, str(tmp_path)], capture_output=True, text=True,
                            timeout=120, check=False, env={"PATH": ""})
    assert result.returncode == 2 and "dev-token needs the control plane" in result.stderr, result.stderr


def test_host_json_queue_settings() -> None:
    import json

    queues = json.loads((ROOT / "host.json").read_text())["extensions"]["queues"]
    assert queues["messageEncoding"] == "base64"
    assert queues["maxDequeueCount"] >= 3
    assert {"batchSize", "visibilityTimeout", "maxPollingInterval"} <= set(queues)


# ---------------------------------------------------------------- the package `func azure functionapp publish` ships


def _funcignored(rel: Path, patterns: list[str]) -> bool:
    """.funcignore's gitignore-style patterns, as far as this repository uses them: a name or glob matching
    any path component, or the whole relative path."""
    from fnmatch import fnmatch

    return any(fnmatch(part, p) for p in patterns for part in rel.parts) or any(fnmatch(str(rel), p) for p in patterns)


def _package(dest: Path) -> Path:
    patterns = [line.strip() for line in (ROOT / ".funcignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    tracked = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.split()
    for name in tracked:
        rel = Path(name)
        if (ROOT / rel).is_file() and not _funcignored(rel, patterns):
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ROOT / rel, dest / rel)
    return dest


_INDEX = """
import json, sys
sys.path[:0] = sys.argv[1:]
import function_app
functions = function_app.app.get_functions()
print(json.dumps({"functions": len(functions), "tools": sorted(m for m in sys.modules
                  if m.split(".")[0] in ("tests", "tensorant_cli", "tensorant_devhost", "tools"))}))
"""


def test_the_published_package_holds_only_the_runtime_and_indexes(tmp_path: Path) -> None:
    package = _package(tmp_path / "package")
    top = sorted(p.name for p in package.iterdir())
    assert top == ["adapter_format", "function_app.py", "functions", "host.json", "requirements.txt", "shared"], top
    readme = (ROOT / "README.md").read_text()
    # Without a local.settings.json (none is committed) Core Tools cannot tell the runtime: --python says it.
    assert "func azure functionapp publish <APP> --python" in readme
    site_packages = [p for p in sys.path if p.endswith("site-packages")]
    done = subprocess.run([sys.executable, "-c", _INDEX, str(package), *site_packages], cwd=package,
                          capture_output=True, text=True, timeout=120, env={"PATH": "", "TENSORANT_ENV": "test"})
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["functions"] >= 40 and report["tools"] == [], report


@pytest.mark.skipif(not os.environ.get("TENSORANT_PACKAGE_LINUX"),
                    reason="downloads the lock's Linux wheels (about 150 MB): TENSORANT_PACKAGE_LINUX=1 to run")
def test_the_lock_installs_for_linux_cpython_311_and_the_app_indexes_from_it_alone(tmp_path: Path) -> None:
    # What remote build does (or `func ... publish --no-build` after this step): the lock into
    # .python_packages/lib/site-packages for the Flex Consumption workers (Linux x86_64, CPython 3.11).
    package = _package(tmp_path / "package")
    target = package / ".python_packages" / "lib" / "site-packages"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    "--target", str(target), "--platform", "manylinux2014_x86_64", "--platform",
                    "manylinux_2_28_x86_64", "--python-version", "3.11", "--implementation", "cp",
                    "--only-binary=:all:", "-r", str(package / "requirements.txt")], check=True, timeout=900)
    # -I -S: no user site, no site-packages of this machine; only the package and what it installed.
    done = subprocess.run([sys.executable, "-I", "-S", "-c", _INDEX, str(package), str(target)], cwd=package,
                          capture_output=True, text=True, timeout=300, env={"PATH": "", "TENSORANT_ENV": "test"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["functions"] >= 40
