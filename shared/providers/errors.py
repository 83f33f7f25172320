"""The small error tree every provider translates vendor errors into.

Permanent: retrying cannot help (bad credentials, zero quota, unsupported image,
no capacity for this run). The step ends the run with `reason`, which says what
the user can do.
Retryable: throttling or a transient failure; the step retries after `retry_after_s`.
"""

from __future__ import annotations


class ProviderError(Exception):
    def __init__(self, reason: str, *, code: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


class PermanentError(ProviderError):
    pass


class AuthError(PermanentError):
    """Credentials rejected or expired (401/403). Never retried in a storm."""


class CapacityError(PermanentError):
    """No capacity for this machine type now; not permanent for the account."""


class QuotaError(PermanentError):
    pass


class RetryableError(ProviderError):
    def __init__(self, reason: str, *, code: str = "", retry_after_s: float = 30.0) -> None:
        super().__init__(reason, code=code)
        self.retry_after_s = retry_after_s


class ThrottledError(RetryableError):
    pass
