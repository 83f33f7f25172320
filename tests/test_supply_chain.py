"""Supply chain (issue 28.9): what the builds run and install is pinned to exact content.

- every GitHub Action by the full commit SHA of its release (a tag can be moved to other code), the
  workflow's token with no permission by default and write only on the job that pushes;
- every pip install in a workflow, in the Dockerfile and in the deployment's build from a lock whose every
  package carries its sha256 (`--require-hashes`);
- the Dockerfile's base image by digest, and the agent in the container as root only for what needs it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml  # PyYAML: installed with moto[server] (dev extras)

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
SHA = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_./-]+@[0-9a-f]{40}$")


def _workflow(path: Path) -> dict[Any, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict)
    return data


def _uses_lines(path: Path) -> list[str]:
    return [line.split("uses:", 1)[1].strip() for line in path.read_text().splitlines()
            if re.match(r"^\s*(-\s+)?uses:", line)]


def test_every_action_is_pinned_by_commit_sha_with_its_tag_in_a_comment() -> None:
    assert WORKFLOWS
    for path in WORKFLOWS:
        uses = _uses_lines(path)
        assert uses, path
        for entry in uses:
            ref, _, comment = entry.partition("#")
            ref = ref.strip()
            if ref.startswith("./"):  # an action of this repository: the checked-out commit itself
                continue
            assert SHA.match(ref), f"{path.name}: {ref!r} is not pinned by a 40-hex commit SHA"
            assert re.fullmatch(r"v\d+(\.\d+)*", comment.strip()), f"{path.name}: {ref!r} names no release tag"


def test_the_sha_check_refuses_tags_and_short_shas() -> None:
    assert not SHA.match("actions/checkout@v5") and not SHA.match("actions/checkout@fbc6f39")
    assert SHA.match("actions/checkout@fbc6f3992d24b796d5a048ff273f7fcc4a7b6c09")


def _pushes(job: dict[str, Any]) -> bool:
    steps = job.get("steps", [])
    return any("docker push" in str(s.get("run", "")) or str(s.get("uses", "")).startswith("docker/login-action")
               or (s.get("with") or {}).get("push") is True for s in steps)


def test_permissions_are_empty_by_default_and_write_only_where_a_job_pushes() -> None:
    for path in WORKFLOWS:
        workflow = _workflow(path)
        assert workflow.get("permissions") == {}, f"{path.name}: set `permissions: {{}}` at the top"
        for name, job in workflow["jobs"].items():
            permissions = job.get("permissions")
            assert isinstance(permissions, dict), f"{path.name}: job {name} declares no permissions"
            writes = sorted(k for k, v in permissions.items() if v == "write")
            if _pushes(job):
                assert writes == ["packages"], f"{path.name}: job {name} writes {writes}"
            else:
                assert writes == [], f"{path.name}: job {name} pushes nothing but may write {writes}"


def test_every_pip_install_in_a_workflow_requires_hashes() -> None:
    installs = 0
    for path in WORKFLOWS:
        for job in _workflow(path)["jobs"].values():
            for step in job["steps"]:
                for line in str(step.get("run", "")).splitlines():
                    if re.search(r"\bpip install\b", line):
                        installs += 1
                        assert "--require-hashes" in line and " -r " in line, f"{path.name}: {line.strip()}"
    assert installs  # the lint job installs its linters


def test_checkouts_keep_no_token_in_the_work_tree() -> None:
    for path in WORKFLOWS:
        for job in _workflow(path)["jobs"].values():
            for step in job["steps"]:
                if str(step.get("uses", "")).startswith("actions/checkout@"):
                    assert step["with"]["persist-credentials"] is False


LOCKS = [ROOT / "requirements.txt", ROOT / "machine" / "trainer" / "image-requirements.txt",
         ROOT / "machine" / "trainer" / "image-requirements-cpu.txt", ROOT / ".github" / "lint-requirements.txt"]


def _hashed_pins(path: Path) -> dict[str, list[str]]:
    """name==version -> its sha256 hashes; a requirement without a hash, or not pinned exactly, fails."""
    pins: dict[str, list[str]] = {}
    current = ""
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip().removesuffix("\\").strip()
        if not line:
            continue
        if line.startswith("--hash="):
            assert current, f"{path.name}: a hash before any requirement"
            assert re.fullmatch(r"--hash=sha256:[0-9a-f]{64}", line), f"{path.name}: {line}"
            pins[current].append(line)
            continue
        assert not line.startswith("-"), f"{path.name}: option {line!r} in a lock (an index, -e, -r)"
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*==[0-9][0-9A-Za-z.+!-]*", line), \
            f"{path.name}: {line!r} is not pinned exactly"
        current = line
        pins[current] = []
    return pins


def test_every_package_of_every_lock_carries_its_hashes() -> None:
    for path in LOCKS:
        pins = _hashed_pins(path)
        assert pins, path
        unhashed = sorted(p for p, hashes in pins.items() if not hashes)
        assert not unhashed, f"{path.relative_to(ROOT)}: no --hash for {unhashed}: run `make lock`"


def test_the_hash_check_refuses_a_bare_pin(tmp_path: Path) -> None:
    lock = tmp_path / "requirements.txt"
    lock.write_text("a==1 \\\n    --hash=sha256:" + "0" * 64 + "\nb==2\n")
    assert _hashed_pins(lock) == {"a==1": ["--hash=sha256:" + "0" * 64], "b==2": []}


def test_the_image_locks_hold_the_trainer_pins() -> None:
    # The trainer's pins (machine/trainer/requirements.txt, what `make install` installs) are what both image
    # locks install: a pin changed there without `make lock` fails here.
    wanted = [line.split("#", 1)[0].strip() for line in (ROOT / "machine/trainer/requirements.txt").read_text().splitlines()]
    wanted = [w for w in wanted if w] + ["bitsandbytes==0.50.2"]
    for name in ("image-requirements.txt", "image-requirements-cpu.txt"):
        pins = {p.split("==")[0].lower(): p.split("==")[1] for p in _hashed_pins(ROOT / "machine" / "trainer" / name)}
        for want in wanted:
            package, version = want.split("==")
            got = pins.get(package.lower(), "")
            assert got == version or (package == "torch" and got == f"{version}+cpu"), f"{name}: {want} vs {got}"


def _instructions(dockerfile: str) -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments left out."""
    out: list[str] = []
    pending = ""
    for raw in dockerfile.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        pending = f"{pending} {line}".strip()
        if pending.endswith("\\"):
            pending = pending.removesuffix("\\").strip()
            continue
        out.append(pending)
        pending = ""
    return out


def _unhashed_installs(dockerfile: str) -> list[str]:
    """Each pip install of the Dockerfile that is not `--no-deps --require-hashes -r <a locked file>`: the
    file installed must be what a COPY put there from a lock of LOCKS, or from a build arg defaulting to one."""
    instructions = _instructions(dockerfile)
    args = dict(i.removeprefix("ARG ").partition("=")[::2] for i in instructions if i.startswith("ARG "))
    locks = {str(p.relative_to(ROOT)) for p in LOCKS}
    copied = {}  # path in the image -> the repository file copied there
    for i in instructions:
        if i.startswith("COPY "):
            source, target = i.split()[1:3]
            arg = re.fullmatch(r"\$\{?(\w+)\}?", source)
            copied[target] = args.get(arg.group(1), "") if arg else source
    bad = []
    for i in instructions:
        for install in re.findall(r"\bpip3? install\b[^;&|]*", i):
            words = install.split()
            files = [words[n + 1] for n, w in enumerate(words[:-1]) if w in ("-r", "--requirement")]
            packages = [w for w in words[2:] if not w.startswith("-") and w not in files]
            if ("--require-hashes" not in words or "--no-deps" not in words or not files or packages
                    or any(copied.get(f) not in locks for f in files)):
                bad.append(install.strip())
    return bad


def test_the_dockerfile_installs_only_from_a_hashed_lock() -> None:
    # The published image's default is the CUDA lock; every install checks each file's sha256 against it and
    # installs nothing it does not name (--no-deps).
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "ARG TRAINER_LOCK=machine/trainer/image-requirements.txt" in _instructions(dockerfile)
    assert re.search(r"\bpip install\b", dockerfile)
    assert _unhashed_installs(dockerfile) == []


def test_the_image_build_passes_the_cpu_lock() -> None:
    # make image / make image-check build where only the CPU torch wheel is on disk: build.sh passes that lock
    # as the build arg (a build without it would try the CUDA lock's wheels and fail on their hashes).
    build = (ROOT / "tools" / "image" / "build.sh").read_text()
    assert "lock=${TRAINER_LOCK:-machine/trainer/image-requirements-cpu.txt}" in build
    assert '--build-arg "TRAINER_LOCK=$lock"' in build


def test_the_install_check_refuses_what_is_not_hashed_from_a_lock() -> None:
    head = "ARG L=machine/trainer/image-requirements.txt\nCOPY ${L} /r.txt\nCOPY machine/trainer/requirements.txt /p.txt\n"
    good = "RUN pip install --no-deps \\\n    --require-hashes -r /r.txt\n"
    assert _unhashed_installs(head + good) == []
    for bad in ("RUN pip install --no-deps -r /r.txt\n",                          # no hash check
                "RUN pip install --require-hashes -r /r.txt\n",                   # its dependencies unchecked
                "RUN pip install --no-deps --require-hashes -r /p.txt\n",         # the pins, not a lock
                "RUN pip install --no-deps --require-hashes -r /r.txt torch\n",   # a package beside the lock
                "RUN true && pip install bitsandbytes==0.50.2\n"):
        assert _unhashed_installs(head + good + bad) == [bad.split("&& ")[-1].removeprefix("RUN ").strip()], bad
