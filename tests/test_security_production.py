"""Production settings are refused by the development tools and checked
when the host starts.

- `tensorant dev-token` mints nothing with production settings, and a --ttl over the
  maximum lifetime is a one-line error, not a traceback;
- the dev host refuses to run with production settings, and its banner never prints a token
  minted with them;
- function_app.py loads the settings at import, so a bad production setting fails the host.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.settings import reset_settings

REPO = Path(__file__).resolve().parent.parent
GOOD_PRODUCTION = {
    "TENSORANT_ENV": "Production",  # compared case-insensitively
    "TENSORANT_JWT_SECRET": "a-production-secret-that-is-long-enough-0123456789",
    "TENSORANT_ENCRYPTION_KEY": "cHJvZHVjdGlvbi1rZXktMzItYnl0ZXMtbG9uZyEhISE=",
    "TENSORANT_PUBLIC_URL": "https://tensorant-prod.azurewebsites.net",
}


@pytest.fixture
def production(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    monkeypatch.chdir(tmp_path)  # no local.settings.json here
    for k, v in GOOD_PRODUCTION.items():
        monkeypatch.setenv(k, v)
    reset_settings()
    yield
    for k in GOOD_PRODUCTION:
        monkeypatch.delenv(k)
    reset_settings()


def test_dev_token_refuses_production(production: None, capsys: pytest.CaptureFixture[str]) -> None:
    from tensorant_cli.main import main

    assert main(["dev-token", "--org", "acme", "--role", "admin"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "eyJ" not in err
    assert "production" in err


def test_dev_token_refuses_bad_production_settings(production: None, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from tensorant_cli.main import main

    monkeypatch.setenv("TENSORANT_JWT_SECRET", "zq9w")
    reset_settings()
    assert main(["dev-token", "--org", "acme"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "refusing to start in production" in err and "zq9w" not in err


def test_dev_token_too_long_ttl_is_a_clear_message(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from tensorant_cli.main import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TENSORANT_USER_TOKEN_MAX_TTL_S", "3600")
    reset_settings()
    try:
        assert main(["dev-token", "--org", "acme", "--ttl", "7200"]) == 2
        out, err = capsys.readouterr()
        assert out == ""
        assert err.startswith("error: ") and "at most 3600 s" in err and "Traceback" not in err
    finally:
        monkeypatch.delenv("TENSORANT_USER_TOKEN_MAX_TTL_S")
        reset_settings()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_dev_host_refuses_production(production: None, capsys: pytest.CaptureFixture[str]) -> None:
    from tensorant_devhost.run import main

    assert main(["--no-azurite", "--port", str(_free_port())]) == 1
    out, err = capsys.readouterr()
    assert "refuses TENSORANT_ENV=production" in err
    assert "TENSORANT_TOKEN=" not in out + err and "eyJ" not in out + err


def test_dev_host_banner_prints_no_token_in_production(production: None, capsys: pytest.CaptureFixture[str]) -> None:
    from tensorant_devhost.run import _banner

    _banner(object(), 7071)
    out = capsys.readouterr().out
    assert "TENSORANT_TOKEN=" not in out and "eyJ" not in out
    assert "no dev token is printed" in out


def test_dev_host_banner_prints_a_token_in_development(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from tensorant_devhost.run import _banner

    monkeypatch.delenv("TENSORANT_ENV", raising=False)
    reset_settings()
    _banner(object(), 7071)
    assert "export TENSORANT_TOKEN=eyJ" in capsys.readouterr().out


def _import_function_app(extra: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENSORANT_")} | extra
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "tools" / "cli"), str(REPO / "tools" / "devhost")])
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", "import function_app"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=120, check=False)
    return result, time.perf_counter() - start


def test_function_app_import_fails_on_a_bad_production_setting() -> None:
    result, _ = _import_function_app(GOOD_PRODUCTION | {"TENSORANT_JWT_SECRET": "x"})
    assert result.returncode != 0
    assert "refusing to start in production" in result.stderr
    assert "TENSORANT_JWT_SECRET is shorter than 32 bytes" in result.stderr


def test_function_app_imports_with_good_production_settings() -> None:
    result, seconds = _import_function_app(GOOD_PRODUCTION)
    assert result.returncode == 0, result.stderr[-2000:]
    assert seconds < 30  # loading settings adds no I/O; the import bench measures the real figure
