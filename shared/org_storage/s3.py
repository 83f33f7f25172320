"""Custom S3 storage (AWS S3 or any S3-compatible endpoint), through boto3 (imported lazily).

Keys follow shared/org_storage/base.py's layout under the configured prefix. The control
plane uses the organization's access key; the agent on a training machine never gets
it: agent_env hands out presigned URLs, each for one object and one method, valid for
AGENT_URL_TTL_S (12 hours by default, at most 7 days, SigV4's limit).
"""

from __future__ import annotations

import io
import json
import uuid
from typing import Any, BinaryIO

from shared.errors import AuthError, PermanentError, ProviderError, RetryableError
from shared.log import register_secret
from shared.models import Check, CheckStatus
from shared.org_storage.base import STREAM_CHUNK, ObjectMissing, Readable, adapter_key, checkpoint_key, logs_key, merged_key
from shared.org_storage.config import S3StorageConfig
from shared.org_storage.endpoint_guard import (
    ENDPOINT_UNREACHABLE,
    EndpointRefused,
    PinnedSender,
    Resolver,
    system_resolver,
)
from shared.settings import get_settings

AGENT_URL_TTL_S = 12 * 3600
MAX_URL_TTL_S = 7 * 24 * 3600
PROBE_PREFIX = ".tensorant-probe/"

_WRONG_REGION = {"PermanentRedirect", "AuthorizationHeaderMalformed", "IllegalLocationConstraintException"}
_MISSING = {"NoSuchKey", "404", "NotFound"}
_AUTH = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403", "AllAccessDisabled",
         "InvalidToken", "ExpiredToken", "AccountProblem"}


def _code(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    return str((response.get("Error") or {}).get("Code") or "")


def _bucket_region(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    headers = (response.get("ResponseMetadata") or {}).get("HTTPHeaders") or {}
    return str(headers.get("x-amz-bucket-region") or (response.get("Error") or {}).get("Region") or "")


class S3Storage:
    kind = "s3"

    def __init__(self, config: S3StorageConfig, *, endpoint: str | None = None, url_ttl_s: int = AGENT_URL_TTL_S,
                 label: str = "", resolver: Resolver = system_resolver, allow_private: bool | None = None) -> None:
        """`endpoint` overrides the config's (tests, and RunPodVolumeStorage which derives its own).
        `allow_private` defaults to the test-only setting TENSORANT_ALLOW_PRIVATE_ENDPOINTS."""
        self.config = config
        self.endpoint = (endpoint if endpoint is not None else config.endpoint).rstrip("/")
        self.url_ttl_s = min(url_ttl_s, MAX_URL_TTL_S)
        self.label = label or "bucket"
        self._client: Any = None
        if allow_private is None:
            allow_private = get_settings().allow_private_endpoints
        # Every request goes to an address checked to be public, pinned for that connection.
        self._sender = PinnedSender(allow_private=allow_private, resolver=resolver)
        register_secret(config.secret_access_key.get_secret_value())

    # ------------------------------------------------------------ plumbing

    @property
    def client(self) -> Any:
        if self._client is None:
            import boto3
            from botocore.config import Config

            # AWS: the regional endpoint, so presigned URLs are signed for the bucket's region.
            endpoint = self.endpoint or f"https://s3.{self.config.region}.amazonaws.com"
            self._client = boto3.client(
                "s3",
                endpoint_url=endpoint,
                region_name=self.config.region,
                aws_access_key_id=self.config.access_key_id,
                aws_secret_access_key=self.config.secret_access_key.get_secret_value(),
                config=Config(signature_version="s3v4", s3={"addressing_style": "path"},
                              connect_timeout=5, read_timeout=60, retries={"max_attempts": 3, "mode": "standard"}),
            )
            self._client.meta.events.register_first("before-send.s3", self._sender)
        return self._client

    def _unreachable(self) -> str:
        return ENDPOINT_UNREACHABLE.format(endpoint=self.endpoint or f"https://s3.{self.config.region}.amazonaws.com")

    def location(self) -> str:
        where = self.endpoint or f"aws:{self.config.region}"
        return f"s3://{self.config.bucket}/{self.config.prefix} at {where}"

    def _key(self, key: str) -> str:
        parts = key.split("/")
        if not key or key.startswith("/") or ".." in parts or "" in parts:
            raise ValueError(f"invalid storage key {key!r}")
        return f"{self.config.prefix}/{key}" if self.config.prefix else key

    def _translate(self, exc: Exception, action: str, key: str) -> Exception:
        """boto errors -> the provider error tree, with what to fix."""
        from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError

        if isinstance(exc, EndpointRefused):
            return PermanentError(f"cannot {action} {key}: {self._unreachable()}", code="endpoint")
        if isinstance(exc, EndpointConnectionError) or (isinstance(exc, BotoCoreError)
                                                         and not isinstance(exc, ClientError)):
            return RetryableError(f"cannot {action} {key}: {self._unreachable()}", code="network")
        code = _code(exc)
        if code in _MISSING:
            return ObjectMissing(key)
        if code in _AUTH:
            return AuthError(f"the storage refused to {action} {key} ({code}); {self._hint(exc)}", code=code)
        status = int(((getattr(exc, "response", None) or {}).get("ResponseMetadata") or {}).get("HTTPStatusCode")
                     or 0)
        if status >= 500 or code in ("SlowDown", "RequestTimeout", "InternalError", "ServiceUnavailable"):
            return RetryableError(f"the storage failed to {action} {key} ({code or status})", code=code)
        return PermanentError(f"the storage refused to {action} {key} ({code}); {self._hint(exc)}", code=code)

    def _hint(self, exc: Exception) -> str:
        """How to fix a failed probe, in the words of the setup page."""
        from botocore.exceptions import ClientError

        c = self.config
        if isinstance(exc, EndpointRefused) or not isinstance(exc, ClientError):
            # One message for refused, timed out, TLS failure and blocked address alike.
            return self._unreachable()
        code = _code(exc)
        region = _bucket_region(exc)
        if code == "NoSuchBucket":
            return f"{self.label} {c.bucket} does not exist at this endpoint; check the name (and the endpoint)"
        if code in _WRONG_REGION or (region and region != c.region):
            return (f"{self.label} {c.bucket} is in another region{f' ({region})' if region else ''}; "
                    f"set the region to the {self.label}'s region")
        if code == "InvalidAccessKeyId":
            return "the access key ID is not known to this endpoint; check it (and that it belongs to this provider)"
        if code == "SignatureDoesNotMatch":
            return "the secret access key does not match the access key ID; paste the secret again"
        if code in ("AccessDenied", "403", "AllAccessDisabled"):
            where = f"{c.bucket}/{c.prefix + '/' if c.prefix else ''}*"
            return (f"the key lacks permission: allow s3:PutObject, s3:GetObject and s3:DeleteObject on {where}")
        return f"the endpoint did not answer as S3 storage (error {code or 'unknown'})"

    # ------------------------------------------------------------ the Protocol

    def validate(self) -> list[Check]:
        key = f"{PROBE_PREFIX}{uuid.uuid4().hex}"
        full = self._key(key)
        body = b"tensorant storage probe " + key.encode()
        where = f"{self.config.bucket}/{full}"
        try:
            self.client.put_object(Bucket=self.config.bucket, Key=full, Body=body)
        except Exception as exc:
            skipped = "not tried: the write failed"
            return [Check(name="write", status=CheckStatus.fail, message=f"cannot write {where}: {self._hint(exc)}"),
                    Check(name="read", status=CheckStatus.warn, message=skipped),
                    Check(name="delete", status=CheckStatus.warn, message=skipped)]
        checks = [Check(name="write", status=CheckStatus.ok, message=f"wrote a probe object {where}")]
        try:
            got = self.client.get_object(Bucket=self.config.bucket, Key=full)["Body"].read()
            ok = got == body
            checks.append(Check(name="read", status=CheckStatus.ok if ok else CheckStatus.fail,
                                message="read the probe back" if ok else "the probe read back different bytes"))
        except Exception as exc:
            checks.append(Check(name="read", status=CheckStatus.fail,
                                message=f"cannot read {where}: {self._hint(exc)}"))
        try:
            self.client.delete_object(Bucket=self.config.bucket, Key=full)
        except Exception as exc:
            checks.append(Check(name="delete", status=CheckStatus.fail, message=(
                f"cannot delete {where}: {self._hint(exc)}; delete is needed to remove run logs and old adapters")))
            return checks
        try:
            gone = not self._exists(full)
            checks.append(Check(name="delete", status=CheckStatus.ok if gone else CheckStatus.fail,
                                message="deleted the probe" if gone else f"{where} is still there after delete"))
        except Exception:
            checks.append(Check(name="delete", status=CheckStatus.warn,
                                message="deleted the probe, but could not confirm it is gone (see the read check)"))
        return checks

    def _exists(self, full: str) -> bool:
        try:
            self.client.head_object(Bucket=self.config.bucket, Key=full)
            return True
        except Exception as exc:
            if _code(exc) in _MISSING:
                return False
            raise

    def put(self, key: str, data: bytes) -> None:
        full = self._key(key)
        try:
            self.client.put_object(Bucket=self.config.bucket, Key=full, Body=data)
        except Exception as exc:
            raise self._translate(exc, "write", key) from exc

    def put_stream(self, key: str, stream: Readable) -> int:
        """Multipart upload in 8 MiB parts read one at a time (no threads, so at most one part
        is held); a stream that raises aborts the upload, leaving no object."""
        from boto3.s3.transfer import TransferConfig

        full = self._key(key)
        counted = _Counting(stream)
        part = 8 * 1024 * 1024
        config = TransferConfig(multipart_threshold=part, multipart_chunksize=part, use_threads=False)
        try:
            self.client.upload_fileobj(counted, self.config.bucket, full, Config=config)
        except Exception as exc:
            if counted.error is not None:  # the stream's own error (e.g. a dataset line check)
                raise counted.error from None
            raise self._translate(exc, "write", key) from exc
        return counted.size

    def _checked_size(self, key: str, full: str, max_bytes: int) -> int:
        """HEAD for the object's size; ValueError above max_bytes (the caller translates SDK errors)."""
        head = self.client.head_object(Bucket=self.config.bucket, Key=full)
        size = int(head.get("ContentLength") or 0)
        if size > max_bytes:
            raise ValueError(f"{key} is {size} bytes, more than the {max_bytes} allowed")
        return size

    def open_stream(self, key: str, max_bytes: int) -> BinaryIO:
        full = self._key(key)
        try:
            self._checked_size(key, full, max_bytes)
            body = self.client.get_object(Bucket=self.config.bucket, Key=full)["Body"]
        except (ValueError, ProviderError, ObjectMissing):
            raise
        except Exception as exc:
            raise self._translate(exc, "read", key) from exc
        return _Capped(body, max_bytes, key)  # type: ignore[return-value]

    def open_range(self, key: str, start: int, max_bytes: int) -> tuple[BinaryIO, int]:
        """HEAD for the size, then a GET of bytes start..size-1 (the rest is refused by _Capped if it grew)."""
        full = self._key(key)
        try:
            size = self._checked_size(key, full, max_bytes)
            if start >= size:
                return io.BytesIO(b""), size
            body = self.client.get_object(Bucket=self.config.bucket, Key=full,
                                          Range=f"bytes={max(0, start)}-{size - 1}")["Body"]
        except (ValueError, ProviderError, ObjectMissing):
            raise
        except Exception as exc:
            raise self._translate(exc, "read", key) from exc
        return _Capped(body, size - max(0, start), key), size  # type: ignore[return-value]

    def upload_url(self, key: str, ttl_s: int) -> str | None:
        url = self.presign("PUT", key, ttl_s)
        register_secret(url)
        return url

    def get(self, key: str, max_bytes: int) -> bytes:
        """HEAD for the size, then a ranged GET capped at max_bytes + 1 (the object may change between)."""
        full = self._key(key)
        try:
            if self._checked_size(key, full, max_bytes) == 0:
                return b""
            resp = self.client.get_object(Bucket=self.config.bucket, Key=full, Range=f"bytes=0-{max_bytes}")
            data = bytes(resp["Body"].read(max_bytes + 1))
        except (ValueError, ProviderError, ObjectMissing):
            raise
        except Exception as exc:
            raise self._translate(exc, "read", key) from exc
        if len(data) > max_bytes:
            raise ValueError(f"{key} is larger than the {max_bytes} bytes allowed")
        return data

    def delete(self, key: str) -> None:
        try:
            self.client.delete_object(Bucket=self.config.bucket, Key=self._key(key))
        except Exception as exc:
            err = self._translate(exc, "delete", key)
            if not isinstance(err, ObjectMissing):
                raise err from exc

    def delete_prefix(self, prefix: str) -> int:
        """ListObjectsV2 under the folder, then one DeleteObject per key (RunPod's S3 API, which this
        class also serves, is not known to support the batch DeleteObjects), the listing's order
        reversed: on a file-system-backed store (a RunPod volume) a folder's entry comes before its
        files, and goes after them."""
        if not prefix.endswith("/"):
            raise ValueError(f"a prefix to delete must end with '/', not {prefix!r}")
        full = self._key(prefix.rstrip("/")) + "/"
        deleted = 0
        try:
            keys = [obj["Key"] for page in self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.config.bucket, Prefix=full) for obj in page.get("Contents") or []]
            for key in reversed(keys):
                self.client.delete_object(Bucket=self.config.bucket, Key=key)
                deleted += 1
        except Exception as exc:
            err = self._translate(exc, "delete", prefix)
            if not isinstance(err, ObjectMissing):
                raise err from exc
        return deleted

    def presign(self, method: str, key: str, ttl_s: int | None = None) -> str:
        """A URL for one object and one method (GET or PUT), valid for ttl_s."""
        op = {"GET": "get_object", "PUT": "put_object"}[method]
        ttl = min(ttl_s or self.url_ttl_s, MAX_URL_TTL_S)
        url: str = self.client.generate_presigned_url(
            op, Params={"Bucket": self.config.bucket, "Key": self._key(key)}, ExpiresIn=ttl)
        return url

    def download_url(self, key: str, ttl_s: int) -> str | None:
        """A presigned GET of one object for ttl_s (registered as a secret: never logged)."""
        url = self.presign("GET", key, ttl_s)
        register_secret(url)
        return url

    def agent_env(self, run_id: str, dataset: str, *, ttl_s: int | None = None,
                  merged: bool = False, checkpoints: int = 0,
                  validation: str = "") -> tuple[dict[str, str], frozenset[str]]:
        """Presigned URLs only (never the access key): GET the dataset, PUT the adapter and the logs.

        Each URL works for its one key and method until it expires (ttl_s, default 12 h):
        a full run longer than that needs ttl_s >= its runtime limit.
        """
        env = {
            "TENSORANT_DATASET_URL": self.presign("GET", dataset, ttl_s),
            "TENSORANT_ADAPTER_UPLOAD_URL": self.presign("PUT", adapter_key(run_id), ttl_s),
            "TENSORANT_LOGS_UPLOAD_URL": self.presign("PUT", logs_key(run_id), ttl_s),
        }
        if merged:
            env["TENSORANT_MERGED_UPLOAD_URL"] = self.presign("PUT", merged_key(run_id), ttl_s)
        if validation:
            env["TENSORANT_EVAL_DATASET_URL"] = self.presign("GET", validation, ttl_s)
        slots = [self.presign("PUT", checkpoint_key(run_id, i), ttl_s) for i in range(checkpoints)]
        for url in [*env.values(), *slots]:
            register_secret(url)
        if slots:
            env["TENSORANT_CHECKPOINT_UPLOAD_URLS"] = json.dumps(slots)
        return env, frozenset(env)


class _Counting:
    """A reader that counts what passed and keeps the stream's own exception (boto3 wraps it)."""

    def __init__(self, stream: Readable) -> None:
        self.stream = stream
        self.size = 0
        self.error: BaseException | None = None

    def read(self, n: int = -1) -> bytes:
        try:
            chunk = self.stream.read(n if n and n > 0 else STREAM_CHUNK)
        except BaseException as exc:
            self.error = exc
            raise
        self.size += len(chunk)
        return chunk


class _Capped:
    """An object body that refuses to yield more than max_bytes (it may have grown since HEAD)."""

    def __init__(self, body: Any, max_bytes: int, key: str) -> None:
        self.body, self.left, self.key = body, max_bytes, key

    def read(self, n: int = -1) -> bytes:
        chunk: bytes = self.body.read(n if n and n > 0 else STREAM_CHUNK)
        self.left -= len(chunk)
        if self.left < 0:
            raise ValueError(f"{self.key} grew past the size allowed while it was read")
        return chunk

    def close(self) -> None:
        self.body.close()

    def __enter__(self) -> _Capped:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
