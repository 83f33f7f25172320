"""AWS codes of an account or region that is not ready, and two resource limits, each get their own
remedy (issue 41.13): before, PendingVerification, OptInRequired and Blocked told the owner to check the
access key, and InsufficientFreeAddressesInSubnet and VolumeLimitExceeded had no hint."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError

from shared.errors import AuthError, PermanentError, QuotaError
from shared.providers.aws.errors import translate


def _error(code: str, message: str = "the message") -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": message},
                        "ResponseMetadata": {"HTTPStatusCode": 400}}, "RunInstances")


@pytest.mark.parametrize(("code", "words"), [
    ("PendingVerification", "being verified"),
    ("OptInRequired", "ap-east-1 is an opt-in region"),
    ("Blocked", "contact AWS Support"),
])
def test_account_state_codes_name_their_own_remedy(code: str, words: str) -> None:
    err = translate(_error(code), action="launching the instance", region="ap-east-1", instance_type="g5.xlarge")
    assert isinstance(err, AuthError) and err.code == code
    assert words in err.reason and "access key" not in err.reason, err.reason


def test_bad_keys_still_say_check_the_key() -> None:
    err = translate(_error("AuthFailure"), action="checking the connection")
    assert "access key ID" in err.reason


def test_a_full_subnet_and_the_ebs_quota_have_hints() -> None:
    subnet = translate(_error("InsufficientFreeAddressesInSubnet"), action="launching the instance")
    assert isinstance(subnet, PermanentError) and "no free IP address" in subnet.reason and "subnet" in subnet.reason
    volume = translate(_error("VolumeLimitExceeded", "You have exceeded your maximum gp3 storage limit"),
                       action="launching the instance", region="us-east-1")
    assert isinstance(volume, QuotaError) and "Service Quotas" in volume.reason and "delete unused volumes" in volume.reason
