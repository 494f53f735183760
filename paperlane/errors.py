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
     ├── JobNotFound              no such job id
     └── WorkerStopping           the worker stopped before the page was done: back to its lane (retryable)

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


class JobNotFound(PaperlaneError):
    """No job has this id."""


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
