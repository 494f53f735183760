"""The error tree of paperlane.

    PaperlaneError                (retryable=False unless said otherwise)
     ├── UsageError               bad command-line or settings: the caller must fix it
     ├── InputError               this page cannot be read: unreadable, truncated, too large, wrong type
     ├── EngineError              the OCR engine failed on this page
     │    ├── EngineUnavailable   engine down, timed out or overloaded (retryable)
     │    └── EngineOutputError   the engine answered but the answer is unusable
     ├── StorageError             object store or database failed
     │    ├── StorageUnavailable  cannot reach it (retryable)
     │    └── ObjectNotFound      a key that should exist does not
     ├── NotFound                 no such id (the API answers 404)
     │    ├── JobNotFound, IngestNotFound, DocumentNotFound, PageNotFound, TenantNotFound
     ├── OutOfMemory              not enough memory for this page now (retryable)
     └── WorkerStopping           the worker stopped before the page was done: back to its lane, the attempt
                                  not counted (retryable)

Every error carries the pipeline ``stage`` it happened in and whether retrying may help.
Third-party exceptions (boto3, redis, httpx, SQLAlchemy, OpenCV) are mapped onto this tree
at the adapter that calls them (``raise StorageUnavailable(...) from exc``).

``public_reason`` turns any exception into the one-line reason stored on a job row: our own
errors keep their message; anything else becomes "internal error" and the traceback goes to
the log, so internal details never reach a client.
"""

from __future__ import annotations

from typing import ClassVar


class PaperlaneError(Exception):
    """Root of every error paperlane raises on purpose."""

    default_retryable: ClassVar[bool] = False

    def __init__(self, message: str, *, stage: str | None = None, retryable: bool | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.stage = stage
        self.retryable = self.default_retryable if retryable is None else retryable

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[object, ...]:
        # Errors cross process boundaries (the CPU pool); keep stage and retryable on the way.
        return (_rebuild, (type(self), self.message, self.stage, self.retryable))


def _rebuild(cls: type[PaperlaneError], message: str, stage: str | None, retryable: bool) -> PaperlaneError:
    return cls(message, stage=stage, retryable=retryable)


class UsageError(PaperlaneError):
    """The command line or the settings are wrong."""


class InputError(PaperlaneError):
    """The page itself cannot be processed; retrying will not help."""


class EngineError(PaperlaneError):
    """The OCR engine failed on a page."""


class EngineUnavailable(EngineError):
    """The engine is unreachable, timed out or overloaded; a later try may succeed."""

    default_retryable = True


class EngineOutputError(EngineError):
    """The engine answered, but the answer cannot be used."""


class StorageError(PaperlaneError):
    """The object store or the database failed."""


class StorageUnavailable(StorageError):
    """The object store or the database cannot be reached right now."""

    default_retryable = True


class ObjectNotFound(StorageError):
    """An object that should exist is missing."""


class NotFound(PaperlaneError):
    """No such resource: what ``what`` names has no row with this id."""

    what = "resource"

    def __init__(self, resource_id: str, *, stage: str | None = None, retryable: bool | None = None) -> None:
        super().__init__(f"no {self.what} with id {resource_id}", stage=stage, retryable=retryable)
        self.resource_id = resource_id

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.resource_id,), {"stage": self.stage, "retryable": self.retryable})


class JobNotFound(NotFound):
    what = "job"


class IngestNotFound(NotFound):
    what = "ingest"


class DocumentNotFound(NotFound):
    what = "document"


class PageNotFound(NotFound):
    what = "page"


class TenantNotFound(NotFound):
    what = "tenant"


class OutOfMemory(PaperlaneError):
    """Memory ran out while working on a page: a later try, with the worker less busy, may succeed."""

    default_retryable = True


class WorkerStopping(PaperlaneError):
    """The worker is stopping (SIGTERM) before this page was done: the page is handed back to its lane,
    not failed, and the attempt does not count."""

    default_retryable = True


INTERNAL_REASON = "internal error (the worker log has the details)"


def public_reason(exc: BaseException) -> str:
    """The one-line, client-safe reason for ``exc``."""
    if isinstance(exc, PaperlaneError):
        return " ".join(str(exc).split()) or type(exc).__name__
    return INTERNAL_REASON


def is_retryable(exc: BaseException) -> bool:
    """True when trying the same page again may succeed."""
    return isinstance(exc, PaperlaneError) and exc.retryable
