"""The provider contract suite: the promises of shared/providers/base.py, tested once for every cloud.

How a provider plugs in (one file, tests/providers/<name>/test_contract.py):

    from tests.providers.contract import CloudContract, ProviderEnv

    class TestAzureContract(CloudContract):
        @pytest.fixture
        def provider_env(self, <your fake cloud fixtures>) -> Iterator[ProviderEnv]:
            yield ProviderEnv(provider=..., ref=..., spec=..., machines=..., disks=...,
                              everything=..., add_foreign=..., page_size=..., handed=...,
                              list_requests=..., slow_release=..., refuse=...)

(`python -m tools.new_provider NAME` writes that file, failing, with the provider's skeleton.) ProviderContract
holds the Protocol's promises and calls every method of it; CloudContract, which every registered provider's
class subclasses, adds the wire: the fake is a server on loopback and each code of the provider's error table,
answered there, becomes its error class. The in-memory MemoryCompute of the flow tests (tests/fakes.py) runs
ProviderContract alone: it has no cloud, and would fail CloudContract.

The fixture points the real provider class at the provider's fake cloud (moto server, the
fake ARM, the fake RunPod GraphQL server, the local process table) and says how to look
into that cloud *without* going through the provider, so every assertion reads the
cloud's own view. Each field of ProviderEnv documents what it must return. A provider
that cannot offer a hook (say, no way to delay deletion) passes None and the one test
that needs it is skipped with the reason; `handed` (what a launch gave the machine) has no
such way out: a provider that cannot show it hands the agent its bootstrap does not pass.
"""

from __future__ import annotations

import dataclasses
import importlib
import ipaddress
import socket
import ssl
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Literal

import pytest
import yaml

from machine.agent.config import overlay_bootstrap
from shared.errors import AuthError, CapacityError, PermanentError, ProviderError, QuotaError, ThrottledError
from shared.models import Check, CloudResource, GpuOffer, MachineState
from shared.providers import bootstrap_env, cloudinit, registry
from shared.providers.base import (
    ERROR_KINDS,
    Bootstrap,
    CloudProgress,
    ComputeProvider,
    LaunchSpec,
    RunRef,
    scope_of,
)

Foreign = Literal["unmarked", "other-deployment"]
MAX_POLLS = 30  # outcome polls before a test gives up (fakes confirm within a few)


# What every launch must get to the agent (the exchange's and the reports' URLs, the run's token).
AGENT_KEYS = ("TENSORANT_RUN_ID", "TENSORANT_API_URL", "TENSORANT_RUN_TOKEN")


@dataclasses.dataclass(frozen=True)
class Handed:
    """What a launch handed the machine, read back from the fake cloud's record of the create call,
    decoded from the cloud's encoding (base64 user data) but otherwise as the machine gets it."""

    user_data: str | None = None
    """Cloud-init user data (EC2 user data, Azure customData): the script and its one-time claim,
    which the machine exchanges for its environment (shared/providers/cloudinit.py)."""
    env: dict[str, str] | None = None
    """The environment the agent process starts with (a RunPod pod's env, the local agent's
    process environment), TENSORANT_BOOTSTRAP still encoded: the check decodes it as the agent does."""
    image: str | None = None
    """The container image the machine is told to run, where the cloud records it apart from
    the user data (RunPod's imageName); None where nothing runs an image (local)."""


@dataclasses.dataclass
class ProviderEnv:
    provider: ComputeProvider
    """The provider under test, built for `ref.deployment` and pointed at the fake cloud."""
    ref: RunRef
    """A run of this deployment that has no machine yet."""
    spec: Callable[[RunRef], LaunchSpec]
    """A launchable spec for any run of this deployment."""
    machines: Callable[[RunRef], list[str]]
    """Ids of the run's machines that exist in the fake cloud (not yet deleted; stopped counts)."""
    disks: Callable[[RunRef], list[str]]
    """Ids of the run's disks that exist in the fake cloud (where the disk is part of the
    machine, as on RunPod or local, the id of what holds it)."""
    everything: Callable[[], dict[str, str]]
    """Every resource the fake cloud holds (this test's ones at least): id -> state."""
    add_foreign: Callable[[Foreign, RunRef], list[str]]
    """Create, directly in the fake cloud, a machine that is not this deployment's:
    "unmarked" (no ownership marks at all) or "other-deployment" (marks of another
    deployment, same org and run id as the given ref). Returns the ids it created."""
    page_size: int
    """The list page size the fixture set on the provider (the provider's smallest allowed)."""
    handed: Callable[[RunRef], Handed]
    """What the launch of the run's machine handed it, read from the fake cloud (not from the
    provider): user data, or the environment and image. Required: the agent's bootstrap is what
    makes a machine a training machine, and check_handed decides whether it got there."""
    list_requests: Callable[[], int] | None = None
    """How many list requests the fake cloud has answered so far; None where the cloud
    has no paging (the provider reads everything in one answer)."""
    slow_release: Callable[[], AbstractContextManager[None]] | None = None
    """A context in which the fake cloud accepts deletion but does not confirm it (the
    machine or its disk stays visible); leaving it lets the deletion finish."""
    refuse: Callable[[str, str], AbstractContextManager[None]] | None = None
    """refuse(kind, code): a context in which the fake cloud answers every request of the provider with the
    cloud's error `code` (one of its errors.py ERROR_TABLE[kind]) as the cloud's wire carries it: the HTTP
    status the cloud gives that kind and its error body, which the provider's real SDK client parses.
    Required by CloudContract; None only where the registry entry is dev_only (no cloud: local)."""


def poll(action: Callable[[], CloudProgress]) -> CloudProgress:
    """Call a CloudProgress-returning method until done (the fakes need no real waiting)."""
    out = action()
    for _ in range(MAX_POLLS):
        if out.done:
            return out
        out = action()
    raise AssertionError(f"never done: {out.detail}")


def check_handed(handed: Handed, spec: LaunchSpec) -> None:
    """Assert the machine got the agent's bootstrap of `spec`: on a cloud-init machine the
    project's script with this run's one-time claim and its URLs, and no value of the
    environment (user data stays readable on the machine); otherwise every variable of the
    environment with its value, as the agent reads it, and the image where the cloud records one."""
    if handed.user_data is not None:
        _check_user_data(handed.user_data, spec)
        return
    assert handed.env is not None, "the launch handed the machine neither user data nor an environment"
    got = overlay_bootstrap(handed.env)
    missing = sorted(k for k, v in spec.bootstrap.env.items() if got.get(k) != v)
    assert not missing, f"the machine's environment lacks or changes {missing} of the agent's bootstrap"
    if handed.image is not None:
        assert handed.image == spec.bootstrap.container_image, f"the machine runs {handed.image!r}"


def _check_user_data(text: str, spec: LaunchSpec) -> None:
    try:
        config: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise AssertionError(f"the user data is not YAML: {exc}") from None
    assert text.startswith("#cloud-config\n") and isinstance(config, dict), "the user data is not a cloud-config"
    files = {f.get("path"): f.get("content", "") for f in config.get("write_files") or [] if isinstance(f, dict)}
    assert cloudinit.SCRIPT in files, f"the user data writes no {cloudinit.SCRIPT}"
    claim = bootstrap_env.claim(spec.ref.org, spec.ref.run_id)
    expected = cloudinit.script(spec.bootstrap, claim)
    assert files[cloudinit.SCRIPT].rstrip("\n") == expected.rstrip("\n"), (
        f"{cloudinit.SCRIPT} is not the bootstrap script for this run's claim, URL and image")
    leaked = sorted(k for k, v in spec.bootstrap.env.items()
                    if k not in cloudinit.REQUIRED and len(v) >= 4 and v in text)
    assert not leaked, f"the user data holds the values of {leaked}; it may hold only the claim"


class DropsTheEnvironment:
    """A provider that launches with a bootstrap of its own in place of the spec's (another token, the
    API URL elsewhere), as a skeleton that never wires the spec through would: what the contract's check
    must catch. Every other method is the wrapped provider's. (Another token, not none: the local
    provider's agent exits at once without one, and its launch then fails before the check is reached.)"""

    def __init__(self, inner: ComputeProvider) -> None:
        self.inner = inner

    def launch(self, spec: LaunchSpec) -> list[CloudResource]:
        own = Bootstrap(container_image=spec.bootstrap.container_image,
                        env={"TENSORANT_RUN_ID": spec.ref.run_id, "TENSORANT_API_URL": "http://127.0.0.1:9/elsewhere",
                             "TENSORANT_RUN_TOKEN": "not-this-runs-token"})
        return self.inner.launch(dataclasses.replace(spec, bootstrap=own))

    def release(self, ref: RunRef, resources: list[CloudResource]) -> CloudProgress:
        return self.inner.release(ref, resources)

    def list_managed(self) -> Iterable[CloudResource]:
        return self.inner.list_managed()


def _ref(env: ProviderEnv, run_id: str) -> RunRef:
    return RunRef(env.ref.deployment, env.ref.org, run_id)


class ProviderContract:
    """Subclass as `class TestXContract(ProviderContract)` and supply the `provider_env` fixture."""

    @pytest.fixture
    def provider_env(self) -> Iterator[ProviderEnv]:
        raise NotImplementedError("the provider's test module supplies the provider_env fixture")
        yield  # pragma: no cover

    def test_launch_twice_is_one_machine(self, provider_env: ProviderEnv) -> None:
        env = provider_env
        first = env.provider.launch(env.spec(env.ref))
        second = env.provider.launch(env.spec(env.ref))
        [machine] = env.machines(env.ref)
        assert machine in {r.id for r in first} and machine in {r.id for r in second}

    def test_preflight_is_a_read_that_never_refuses_the_runs_own_machine(self, provider_env: ProviderEnv) -> None:
        env = provider_env
        spec = env.spec(env.ref)
        said = env.provider.preflight(spec.offer)
        assert said is None or (isinstance(said, str) and said.strip()), said
        assert env.machines(env.ref) == []  # a read: nothing created
        env.provider.launch(spec)
        assert env.provider.preflight(spec.offer, env.ref) is None  # a repeated launch finds its machine

    def test_release_of_a_missing_machine_is_done(self, provider_env: ProviderEnv) -> None:
        env = provider_env
        never = _ref(env, env.ref.run_id + "-never")
        assert env.provider.release(never, []).done
        # A recorded machine that has vanished since is "not found", which is success too.
        resources = env.provider.launch(env.spec(env.ref))
        poll(lambda: env.provider.release(env.ref, resources))
        assert env.machines(env.ref) == []
        assert env.provider.release(env.ref, resources).done

    def test_foreign_resources_are_untouched(self, provider_env: ProviderEnv) -> None:
        env = provider_env
        # The most dangerous foreign machines carry our run's id: only the marks tell them apart.
        foreign = env.add_foreign("unmarked", env.ref) + env.add_foreign("other-deployment", env.ref)
        assert foreign
        before = {k: v for k, v in env.everything().items() if k in foreign}
        assert set(before) == set(foreign)
        assert not {r.id for r in env.provider.list_managed()} & set(foreign)
        # Nothing of our own yet: retain/release must find nothing to act on.
        poll(lambda: env.provider.retain(env.ref, []))
        poll(lambda: env.provider.release(env.ref, []))
        resources = env.provider.launch(env.spec(env.ref))
        assert not {r.id for r in resources} & set(foreign)
        poll(lambda: env.provider.retain(env.ref, resources))
        assert not {r.id for r in env.provider.list_managed()} & set(foreign)
        poll(lambda: env.provider.release(env.ref, resources))
        after = {k: v for k, v in env.everything().items() if k in foreign}
        assert after == before
        assert env.machines(env.ref) == []

    def test_retain_keeps_the_disk(self, provider_env: ProviderEnv) -> None:
        env = provider_env
        resources = env.provider.launch(env.spec(env.ref))
        disks = env.disks(env.ref)
        assert disks
        poll(lambda: env.provider.retain(env.ref, resources))
        assert env.disks(env.ref) == disks
        assert env.machines(env.ref)  # stopped, not deleted
        assert env.provider.retain(env.ref, resources).done  # idempotent
        poll(lambda: env.provider.release(env.ref, resources))
        assert env.disks(env.ref) == [] and env.machines(env.ref) == []

    def test_list_managed_pages_through_everything(self, provider_env: ProviderEnv) -> None:
        env = provider_env
        refs = [_ref(env, f"{env.ref.run_id}-p{i}") for i in range(env.page_size + 1)]
        for ref in refs:
            env.provider.launch(env.spec(ref))
        expected = {m for ref in refs for m in env.machines(ref)}
        assert len(expected) == len(refs)
        asked = env.list_requests() if env.list_requests else 0
        listed = list(env.provider.list_managed())
        assert expected <= {r.id for r in listed}
        assert {r.run_id for r in listed if r.id in expected} == {ref.run_id for ref in refs}
        assert all(r.deployment == env.ref.deployment for r in listed)
        if env.list_requests is not None:
            assert env.list_requests() - asked > 1, "more machines than one page, but list_managed read one page"
        for ref in refs:
            poll(lambda ref=ref: env.provider.release(ref, []))  # type: ignore[misc]

    def test_release_is_done_only_after_the_cloud_confirms(self, provider_env: ProviderEnv) -> None:
        env = provider_env
        if env.slow_release is None:
            pytest.skip("this fake cloud cannot delay a deletion")
        resources = env.provider.launch(env.spec(env.ref))
        with env.slow_release():
            first = env.provider.release(env.ref, resources)
            assert not first.done, first.detail
            assert first.retry_after_s > 0
            assert env.machines(env.ref) or env.disks(env.ref)
        poll(lambda: env.provider.release(env.ref, resources))
        assert env.machines(env.ref) == [] and env.disks(env.ref) == []

    def test_launch_hands_the_machine_the_agents_bootstrap(self, provider_env: ProviderEnv) -> None:
        env = provider_env
        spec = env.spec(env.ref)
        absent = [k for k in AGENT_KEYS if not spec.bootstrap.env.get(k)]
        assert not absent, f"the fixture's spec must carry what the agent needs: {absent}"
        env.provider.launch(spec)
        check_handed(env.handed(env.ref), spec)
        env.provider.launch(spec)  # found, not created: what the machine got is unchanged
        check_handed(env.handed(env.ref), spec)
        poll(lambda: env.provider.release(env.ref, []))

    def test_the_check_fails_a_launch_that_drops_the_bootstrap(self, provider_env: ProviderEnv) -> None:
        # The hook reads what the cloud recorded, not the spec: a launch that hands the machine a
        # bootstrap of its own (another token, another API URL) must fail the check above.
        env = provider_env
        spec = env.spec(env.ref)
        dropping = DropsTheEnvironment(env.provider)
        dropping.launch(spec)
        handed = env.handed(env.ref)
        with pytest.raises(AssertionError):
            check_handed(handed, spec)
        poll(lambda: dropping.release(env.ref, []))

    def test_describe_follows_the_machine_and_a_missing_one_is_gone(self, provider_env: ProviderEnv) -> None:
        env = provider_env
        never = _ref(env, env.ref.run_id + "-never")
        assert env.provider.describe(never, []).state == MachineState.gone  # not found is an answer, not an error
        resources = env.provider.launch(env.spec(env.ref))
        seen = env.provider.describe(env.ref, resources)
        assert seen.state in (MachineState.pending, MachineState.running), seen
        assert env.provider.describe(env.ref, []).state in (MachineState.pending, MachineState.running)  # by its marks
        poll(lambda: env.provider.release(env.ref, resources))
        # By its marks (a recorded machine just created may read pending for a while: RunPod's lag).
        assert env.provider.describe(env.ref, []).state == MachineState.gone

    def test_start_brings_a_retained_machine_back_and_refuses_a_missing_one(self, provider_env: ProviderEnv) -> None:
        env = provider_env
        never = _ref(env, env.ref.run_id + "-never")
        with pytest.raises(PermanentError):
            poll(lambda: env.provider.start(never, []))  # nothing to start
        resources = env.provider.launch(env.spec(env.ref))
        machines = env.machines(env.ref)
        poll(lambda: env.provider.retain(env.ref, resources))
        assert env.provider.describe(env.ref, resources).state in (MachineState.stopped, MachineState.stopping)
        poll(lambda: env.provider.start(env.ref, resources))
        assert env.machines(env.ref) == machines  # the same machine, not a new one
        assert env.provider.describe(env.ref, resources).state in (MachineState.pending, MachineState.running)
        assert poll(lambda: env.provider.start(env.ref, resources)).done  # starting a running machine: done again
        poll(lambda: env.provider.release(env.ref, resources))

    def test_reads_create_nothing(self, provider_env: ProviderEnv) -> None:
        # validate, offers and scope are reads: a connection check or a catalog refresh never bills.
        env = provider_env
        before = env.everything()
        checks = env.provider.validate()
        assert isinstance(checks, list) and checks and all(isinstance(c, Check) for c in checks), checks
        offers = env.provider.offers()
        assert offers and all(isinstance(o, GpuOffer) for o in offers), offers
        assert len({o.offer_id for o in offers}) == len(offers), "offer ids repeat"
        for o in offers:
            assert o.compute_per_hour >= 0 and o.disk_per_hour >= 0, o
            assert abs(o.total_per_hour - (o.compute_per_hour + o.disk_per_hour)) < 1e-6, o
        scope = env.provider.scope()
        assert isinstance(scope, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in scope.items())
        assert scope_of(env.provider) == scope  # stable: a run's recorded scope is compared with it later
        assert env.everything() == before
        assert env.machines(env.ref) == []


# What the provider must raise for a cloud's refusal of each kind (not_found is checked by what it means:
# gone, done, nothing to start).
RAISED = {"capacity": CapacityError, "quota": QuotaError, "auth": AuthError, "throttled": ThrottledError}
MAY_BE_ABSENT = {"quota"}  # a cloud without quotas (RunPod: credit and stock bound an account)


@contextmanager
def socket_writes() -> Iterator[list[Any]]:
    """The peer addresses this thread writes to while inside (TCP, with TLS or without): how the contract
    tells a provider that talks to its fake cloud over the wire from one that reads a dict in memory."""
    seen: list[Any] = []
    me = threading.get_ident()
    patched: list[tuple[type, str, Any]] = []

    def recording(original: Any) -> Any:
        def write(sock: socket.socket, *args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() == me and sock.family in (socket.AF_INET, socket.AF_INET6):
                try:
                    seen.append(sock.getpeername())
                except OSError:
                    seen.append(("unconnected", 0))
            return original(sock, *args, **kwargs)
        return write

    for cls in (socket.socket, ssl.SSLSocket):
        for name in ("send", "sendall"):
            patched.append((cls, name, cls.__dict__.get(name)))  # None: inherited from _socket.socket (C)
            setattr(cls, name, recording(getattr(cls, name)))
    try:
        yield seen
    finally:
        for cls, name, original in reversed(patched):
            if original is None:
                delattr(cls, name)
            else:
                setattr(cls, name, original)


def _loopback(address: Any) -> bool:
    try:
        return ipaddress.ip_address(str(address[0])).is_loopback
    except ValueError:
        return False


class CloudContract(ProviderContract):
    """The contract of a registered provider (tests/providers/test_registry.py requires every one to subclass
    this and to override none of its tests): ProviderContract, and its fake cloud is a server on loopback
    that the provider's real SDK client reaches over the wire, and every code of its error table, answered
    by that server as the cloud does, becomes the error class of its kind. A provider on an in-memory fake
    fails here; a dev_only provider (no cloud: the machine is a process on this host) skips these."""

    @staticmethod
    def _cloud(env: ProviderEnv) -> tuple[Any, dict[str, frozenset[str]], dict[str, str]]:
        info = registry.info_of(env.provider.name)
        assert info is not None, f"{env.provider.name!r} is not a registered provider"
        if info.dev_only:
            pytest.skip(f"{info.name} is dev_only: its machine is a process on this host, with no cloud")
        try:
            errors = importlib.import_module(f"shared.providers.{info.name}.errors")
        except ModuleNotFoundError as exc:
            raise AssertionError(f"shared/providers/{info.name}/errors.py is missing: {exc}") from None
        table = getattr(errors, "ERROR_TABLE", None)
        assert isinstance(table, dict), f"shared/providers/{info.name}/errors.py has no ERROR_TABLE"
        return info, table, dict(getattr(errors, "ABSENT_KINDS", {}))

    def test_the_provider_reaches_its_fake_cloud_over_loopback(self, provider_env: ProviderEnv) -> None:
        env = provider_env
        self._cloud(env)
        with socket_writes() as seen:
            resources = env.provider.launch(env.spec(env.ref))
            env.provider.describe(env.ref, resources)
            poll(lambda: env.provider.release(env.ref, resources))
        assert seen, (f"{env.provider.name} wrote nothing to any socket while it launched, described and released "
                      "a machine: its fake cloud must be a server on loopback that the real SDK client talks to")
        away = sorted({str(a) for a in seen if not _loopback(a)})
        assert not away, f"{env.provider.name} reached past loopback in a test: {away}"

    def test_the_error_table_maps_every_kind(self, provider_env: ProviderEnv) -> None:
        info, table, absent = self._cloud(provider_env)
        where = f"shared/providers/{info.name}/errors.py"
        assert set(table) <= set(ERROR_KINDS), f"{where}: ERROR_TABLE kinds {sorted(set(table) - set(ERROR_KINDS))}"
        for kind in ERROR_KINDS:
            if kind in absent:
                assert kind in MAY_BE_ABSENT and len(absent[kind].strip()) >= 20 and not table.get(kind), \
                    f"{where}: ABSENT_KINDS may name only {sorted(MAY_BE_ABSENT)}, with its reason, and no codes"
                continue
            codes = table.get(kind) or ()
            assert codes and all(isinstance(c, str) and c.strip() for c in codes), \
                f"{where}: ERROR_TABLE[{kind!r}] needs the cloud's codes for a {kind} refusal"

    @pytest.mark.parametrize("kind", ERROR_KINDS)
    def test_each_code_of_the_error_table_is_translated_from_the_wire(self, provider_env: ProviderEnv,
                                                                       kind: str) -> None:
        env = provider_env
        _, table, absent = self._cloud(env)
        if kind in absent:
            pytest.skip(f"the cloud has no {kind} refusal: {absent[kind]}")
        assert table.get(kind), f"ERROR_TABLE has no {kind} codes"
        assert env.refuse is not None, "a cloud provider's ProviderEnv must set refuse"
        resources = env.provider.launch(env.spec(env.ref)) if kind == "not_found" else []
        for code in sorted(table[kind]):
            with socket_writes() as seen, env.refuse(kind, code):
                if kind == "not_found":
                    # Nothing to start is permanent, and no other kind: neither a retry, a failover nor a
                    # credential problem. (What a missing machine means to describe and release, gone and done,
                    # the tests above check on machines that are really missing: a cloud answers a filtered
                    # listing with nothing, not with this code.)
                    with pytest.raises(PermanentError) as missing:
                        env.provider.start(env.ref, resources)
                    assert not isinstance(missing.value, (AuthError, CapacityError, QuotaError)), (code, missing.value)
                else:
                    with pytest.raises(ProviderError) as caught:
                        env.provider.launch(env.spec(env.ref))
                    assert isinstance(caught.value, RAISED[kind]), \
                        f"{code!r} ({kind}) became {type(caught.value).__name__}: {caught.value}"
            assert seen and all(_loopback(a) for a in seen), \
                f"the refused call for {code!r} did not reach the fake cloud over loopback: {seen}"
        if resources:
            poll(lambda: env.provider.release(env.ref, resources))
