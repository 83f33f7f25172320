"""RunPod's GraphQL errors as the API words them (graphql-js): a request the schema refuses is permanent."""

from __future__ import annotations

import pytest

from shared.errors import PermanentError, RetryableError
from shared.providers.runpod.errors import translate


@pytest.mark.parametrize("message", [
    'Field "minCudaVersion" is not defined by type "PodFindAndDeployOnDemandInput".',
    'Variable "$input" got invalid value { gpuCount: 1 }; Field "bogus" is not defined by type "PodInput".',
    'Variable "$cuda" got invalid value "12"; Expected type "CudaVersion".',
    'Cannot query field "stockStatus" on type "LowestPrice".',
])
def test_a_request_the_schema_refuses_is_permanent(message: str) -> None:
    got = translate(message)
    assert isinstance(got, PermanentError) and got.code == "schema", (message, got)


def test_an_unknown_message_is_still_retryable() -> None:
    assert isinstance(translate("Something went wrong. Please try again later."), RetryableError)
