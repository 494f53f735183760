"""S3-compatible object storage through boto3 (AWS S3, MinIO, SeaweedFS, ...)."""

from __future__ import annotations

import logging
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError
from botocore.utils import determine_content_length

from paperlane.errors import ObjectNotFound, StorageError, StorageUnavailable
from paperlane.settings import StorageSettings
from paperlane.storage.objects import split_range, too_large

log = logging.getLogger(__name__)

_MISSING = {"404", "NoSuchKey", "NotFound"}


class S3Store:
    def __init__(self, client: Any, bucket: str, *, prefix: str = "") -> None:
        self._s3 = client  # a boto3 S3 client (boto3 ships no types for its generated methods)
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""

    @classmethod
    def from_settings(cls, cfg: StorageSettings) -> S3Store:
        """A store with a new client. Build one per process and share it: a client is thread-safe, and
        each one costs milliseconds of CPU to build and keeps its own connections."""
        client = boto3.client(
            "s3",
            endpoint_url=cfg.endpoint_url,
            region_name=cfg.region,
            aws_access_key_id=cfg.access_key_id,
            aws_secret_access_key=cfg.secret_access_key.get_secret_value() if cfg.secret_access_key else None,
            config=Config(retries={"max_attempts": 4, "mode": "standard"}, connect_timeout=5, read_timeout=60,
                          # Every page costs a GET and two PUTs: skip botocore's client-side parameter
                          # validation (our own calls, fixed shapes) and the SHA-256 of each body that
                          # SigV4 adds over plain HTTP (TLS or S3's own checksums cover integrity).
                          s3={"addressing_style": "path", "payload_signing_enabled": False},
                          parameter_validation=False, max_pool_connections=cfg.max_connections),
        )
        # botocore asks for "100 Continue" before every PutObject body (it makes each a file), a round trip more
        # per page's object: worth it for a large body a server may refuse (sent for nothing), not for a page's.
        client.meta.events.register_last("before-call.s3", _continue_for_large_bodies_only)
        store = cls(client, cfg.bucket, prefix=cfg.prefix)
        if cfg.create_bucket:
            try:
                store.ensure_bucket()
            except StorageUnavailable as exc:  # a store that is down now may be back by the first page
                log.warning("%s; continuing, pages will retry", exc)
        return store

    @property
    def client(self) -> object:
        """The boto3 client (thread-safe), for reading other buckets: ``s3://`` sources of an ingest."""
        return self._s3

    def ensure_bucket(self) -> None:
        try:
            self._s3.head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            if _code(exc) not in _MISSING:
                raise _mapped(exc, f"bucket {self.bucket}") from exc
            try:
                self._s3.create_bucket(Bucket=self.bucket)
            except ClientError as exc2:
                if _code(exc2) not in {"BucketAlreadyOwnedByYou", "BucketAlreadyExists"}:
                    raise _mapped(exc2, f"bucket {self.bucket}") from exc2
        except BotoCoreError as exc:
            raise _mapped(exc, f"bucket {self.bucket}") from exc

    def put(self, key: str, data: bytes, *, content_type: str = "application/octet-stream") -> None:
        try:
            self._s3.put_object(Bucket=self.bucket, Key=self.prefix + key, Body=data,
                                ContentType=content_type)
        except (ClientError, BotoCoreError) as exc:
            raise _mapped(exc, key) from exc

    def get(self, key: str, *, max_bytes: int | None = None) -> bytes:
        base, span = split_range(key)
        if span is not None and max_bytes is not None and span[1] - span[0] > max_bytes:
            raise too_large(key, span[1] - span[0], max_bytes)
        extra = {"Range": f"bytes={span[0]}-{span[1] - 1}"} if span else {}
        try:
            obj = self._s3.get_object(Bucket=self.bucket, Key=self.prefix + base, **extra)
            size = int(obj.get("ContentLength", 0))
            if max_bytes is not None and size > max_bytes:  # its headers say so: the body stays unread
                obj["Body"].close()
                raise too_large(key, size, max_bytes)
            return obj["Body"].read()
        except (ClientError, BotoCoreError) as exc:
            raise _mapped(exc, key) from exc

    def exists(self, key: str) -> bool:
        try:
            self._s3.head_object(Bucket=self.bucket, Key=self.prefix + key)
        except ClientError as exc:
            if _code(exc) in _MISSING:
                return False
            raise _mapped(exc, key) from exc
        except BotoCoreError as exc:
            raise _mapped(exc, key) from exc
        return True

    def size(self, key: str) -> int:
        base, span = split_range(key)
        if span is not None:
            return span[1] - span[0]
        try:
            head = self._s3.head_object(Bucket=self.bucket, Key=self.prefix + base)
        except (ClientError, BotoCoreError) as exc:
            raise _mapped(exc, key) from exc
        return int(head["ContentLength"])

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{self.prefix}{key}"


_CONTINUE_ABOVE = 2 << 20  # bytes: as the AWS SDK for Go (v2) does by default


def _continue_for_large_bodies_only(params: dict[str, Any], **kwargs: Any) -> None:
    """No ``Expect: 100-continue`` on a request whose body is known to be under ``_CONTINUE_ABOVE``."""
    headers = params.get("headers") or {}
    if "Expect" in headers:
        size = determine_content_length(params.get("body"))
        if size is not None and size < _CONTINUE_ABOVE:
            del headers["Expect"]


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _mapped(exc: Exception, what: str) -> StorageError:
    if isinstance(exc, ClientError):
        code = _code(exc)
        if code in _MISSING:
            return ObjectNotFound(f"object {what} not found", stage="store")
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        if status >= 500 or code in {"SlowDown", "RequestTimeout", "ServiceUnavailable"}:
            return StorageUnavailable(f"object store error on {what}: {code}", stage="store")
        return StorageError(f"object store refused {what}: {code}", stage="store")
    if isinstance(exc, EndpointConnectionError):
        return StorageUnavailable(f"object store unreachable ({exc.kwargs.get('endpoint_url', '')})", stage="store")
    return StorageUnavailable(f"object store error on {what}: {type(exc).__name__}", stage="store")
