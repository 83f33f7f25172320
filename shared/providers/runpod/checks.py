"""The checks run after a RunPod compute connection is saved; each is a named result with a fix hint.
Saving creates nothing, so write permissions cannot be proven (a warn check says so)."""

from __future__ import annotations

import re

from shared.errors import AuthError, ProviderError, RetryableError
from shared.models import Check, CheckStatus
from shared.providers.runpod.client import VOLUMES, RunPodApi, account, balance_of, list_pods
from shared.providers.runpod.config import RunPodConfig


def looks_like_s3_key(key: str) -> bool:
    """RunPod S3 API keys are `user_...` (access key) and `rps_...` (secret); AWS keys start AKIA/ASIA."""
    return bool(re.match(r"^(rps_|user_|AKIA|ASIA)", key.strip()))


def run_checks(api: RunPodApi, config: RunPodConfig, prefix: str) -> list[Check]:
    key = config.api_key.get_secret_value()
    if looks_like_s3_key(key):
        return [Check(name="api key", status=CheckStatus.fail, message=(
            "This looks like an S3 API key (access key user_…, secret rps_…), not a RunPod API key. "
            "The compute connection needs an API key from RunPod → Settings → API Keys; the S3 key belongs "
            "to the storage connection. They are not interchangeable."))]
    checks: list[Check] = []
    try:
        acct = account(api)
        pods = list_pods(api)
    except AuthError as exc:
        return [Check(name="api key", status=CheckStatus.fail, message=exc.reason)]
    except RetryableError as exc:
        return [Check(name="api key", status=CheckStatus.fail, message=f"{exc.reason}; check again later")]
    except ProviderError as exc:  # permanent: a later check would be answered the same
        return [Check(name="api key", status=CheckStatus.fail, message=exc.reason)]
    ours = sum(1 for p in pods if str(p.get("name", "")).startswith(prefix))
    checks.append(Check(name="api key", status=CheckStatus.ok,
                        message=f"RunPod accepted the key (account {acct.get('id', '?')})"))
    checks.append(balance_check(balance_of(acct)))
    checks.append(Check(name="list pods", status=CheckStatus.ok,
                        message=f"the key can list pods ({len(pods)} in the account, {ours} managed here)"))
    checks.append(Check(name="write permissions", status=CheckStatus.warn, message=(
        "This check cannot prove write permissions (create, start, stop and delete pods) because it creates "
        "nothing. Give the key read/write access to pods: a read-only key cannot launch or clean up runs.")))
    if config.network_volume_id:
        checks.append(_check_volume(api, config))
    return checks

# Below this much prepaid credit the balance check warns: a retained pod's disk, or one short trial,
# can use it up, and RunPod stops (then deletes) pods of an account without credit.
LOW_BALANCE_USD = 10.0


def balance_check(balance: float | None) -> Check:
    """RunPod accounts run on prepaid credit: show it on the connection, warn when it is low."""
    if balance is None:
        return Check(name="balance", status=CheckStatus.warn, message=(
            "RunPod did not report the account's credit balance; launches check it again and are refused "
            "when it cannot cover the run's price limit x runtime limit."))
    if balance < LOW_BALANCE_USD:
        return Check(name="balance", status=CheckStatus.warn, message=(
            f"the account has ${balance:.2f} of prepaid credit, below ${LOW_BALANCE_USD:.0f}: add credit in "
            "RunPod → Billing. A launch is refused when the credit cannot cover its price limit x runtime limit, "
            "and retained pods keep billing storage."))
    return Check(name="balance", status=CheckStatus.ok, message=(
        f"the account has ${balance:.2f} of prepaid credit; each launch must be covered by it "
        "(price limit x runtime limit)"))


def _check_volume(api: RunPodApi, config: RunPodConfig) -> Check:
    vid, dc = config.network_volume_id, config.datacenter_id
    try:
        volumes = (api.query(VOLUMES).get("myself") or {}).get("networkVolumes") or []
    except ProviderError as exc:
        return Check(name="network volume", status=CheckStatus.fail, message=(
            f"cannot list network volumes: {exc.reason}. Allow network-volume discovery on the API key."))
    match = next((v for v in volumes if v.get("id") == vid), None)
    if match is None:
        return Check(name="network volume", status=CheckStatus.fail, message=(
            f"network volume {vid} is not in this RunPod account; check the volume ID in RunPod → Storage"))
    if match.get("dataCenterId") != dc:
        return Check(name="network volume", status=CheckStatus.fail, message=(
            f"network volume {vid} is in {match.get('dataCenterId')}, not {dc}; fix the storage connection"))
    return Check(name="network volume", status=CheckStatus.ok,
                 message=f"network volume {vid} ({match.get('name', '')}) is in {dc}; pods will run there")
