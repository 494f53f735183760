"""The error tree of paperlane.

    PaperlaneError                (retryable=False unless said otherwise)
     ├── UsageError               bad command-line or settings: the caller must fix it
     ├── InputError               this page cannot be read: unreadable, truncated, too large, wrong type
     │    └── OverLimit            preparing it went past a worker's memory or time limit, or crashed its process
     ├── EngineError              the OCR engine failed on this page
     │    ├── EngineUnavailable   engine down, timed out or overloaded (retryable)
     │    └── EngineOutputError   the engine answered but the answer is unusable
     ├── StorageError             object store or database failed
     │    ├── StorageUnavailable  cannot reach it (retryable)
     │    ├── ObjectNotFound      a key that should exist does not
     │    └── ObjectTooLarge      an object larger than the reader takes (found before its body is read)
     ├── NotFound                 no such id (the API answers 404)
     │    ├── JobNotFound, IngestNotFound, DocumentNotFound, PageNotFound, TenantNotFound
     ├── OverBudget               the tenant has as many pages in flight as it may (retryable when the pages
     │                            asked for fit in its budget at all)
     ├── MonthlyBudgetUsed        the tenant's pages this month would pass its monthly budget
     ├── OutOfMemory              not enough memory for this page now (retryable)
     └── WorkerStopping           the worker stopped before the page was done: back to its lane, the attempt
                                  not counted (retryable)

Every error carries the pipeline ``stage`` it happened in and whether retrying may help.
Third-party exceptions (boto3, redis, httpx, SQLAlchemy, OpenCV) are mapped onto this tree
at the adapter that calls them (``raise StorageUnavailable(...) from exc``).

``public_reason`` turns any exception into the one-line reason stored on a job row: our own
errors keep their message; anything else becomes "internal error" and the traceback goes to
the log, so internal details never reach a client. ``first_error`` words what a validation found wrong in one
line, for every edge that validates (the CLI's options, the API's requests, the page messages on the lanes).
"""

from __future__ import annotations

import re
from collections.abc import Collection
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


class OverLimit(InputError):
    """Preparing the page (rendering a PDF page, decoding an image) took more memory or time than a worker
    gives one page, or crashed the process it ran in: that process is replaced, and the page fails."""


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


class ObjectTooLarge(StorageError):
    """An object is larger than the reader asked for at most (``size`` bytes, when known: not after a trip
    between processes); its body was not read."""

    def __init__(self, message: str, *, stage: str | None = None, retryable: bool | None = None,
                 size: int = 0) -> None:
        super().__init__(message, stage=stage, retryable=retryable)
        self.size = size


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


class OverBudget(PaperlaneError):
    """A tenant's pages in flight would pass its budget: retryable once some are final, unless the pages asked
    for are more than the whole budget."""

    def __init__(self, *, asked: int, in_flight: int, cap: int) -> None:
        if asked > cap:
            message = f"{asked:,} pages are more than this tenant may have in flight ({cap:,})"
        else:
            message = f"this tenant has {in_flight:,} pages in flight; {asked:,} more would pass its {cap:,}"
        super().__init__(message, stage="upload", retryable=asked <= cap)
        self.asked, self.in_flight, self.cap = asked, in_flight, cap

    def __reduce__(self) -> tuple[object, ...]:
        return (_over_budget, (self.asked, self.in_flight, self.cap))


def _over_budget(asked: int, in_flight: int, cap: int) -> OverBudget:
    return OverBudget(asked=asked, in_flight=in_flight, cap=cap)


class MonthlyBudgetUsed(PaperlaneError):
    """A tenant's pages reserved this month would pass its monthly budget (not retryable: the month must end)."""

    def __init__(self, *, asked: int, used: int, limit: int) -> None:
        super().__init__(f"this tenant has used {used:,} of its {limit:,} pages this month; {asked:,} more would "
                         "pass it", stage="upload", retryable=False)
        self.asked, self.used, self.limit = asked, used, limit

    def __reduce__(self) -> tuple[object, ...]:
        return (_monthly, (self.asked, self.used, self.limit))


def _monthly(asked: int, used: int, limit: int) -> MonthlyBudgetUsed:
    return MonthlyBudgetUsed(asked=asked, used=used, limit=limit)


class OutOfMemory(PaperlaneError):
    """Memory ran out while working on a page: a later try, with the worker less busy, may succeed."""

    default_retryable = True


class WorkerStopping(PaperlaneError):
    """The worker is stopping (SIGTERM) before this page was done: the page is handed back to its lane,
    not failed, and the attempt does not count."""

    default_retryable = True


def first_error(exc: Exception, *, what: str = "", unnamed: Collection[str] = ()) -> str:
    """The first thing a pydantic ``ValidationError`` (or FastAPI's) found wrong, on one line: where (``what``, the
    thing validated, then ``.field`` and ``[index]`` into it, leaving out the parts in ``unnamed``) and why; any
    other exception's own text."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return str(exc)
    found = errors()
    if not found:
        return "invalid"
    first = found[0]
    if first["type"] == "json_invalid":
        return f"{what + ': ' if what else ''}not JSON ({first['msg'].removeprefix('Invalid JSON: ')})"
    where = (what + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first["loc"]
                            if p not in unnamed)).lstrip(".")
    return f"{where}: {first['msg']}" if where else str(first["msg"])


INTERNAL_REASON = "internal error (the worker log has the details)"


def public_reason(exc: BaseException) -> str:
    """The one-line, client-safe reason for ``exc``."""
    if isinstance(exc, PaperlaneError):
        return " ".join(str(exc).split()) or type(exc).__name__
    return INTERNAL_REASON


# What a reason must not tell a client: where paperlane's services are (URLs, addresses, host:port, psycopg2's
# 'server at "db"'), and SQL (SQLAlchemy's "[SQL: ...]", a statement quoted in a driver's message).
_ADDRESSES = re.compile(r"""
      \b(?!s3://)[a-z][a-z0-9+.-]*://[^\s'"<>()]+         # a URL (an s3:// one names a bucket: the caller's)
    | \[[0-9a-f:.]+\](?::\d+)?                         # [IPv6]:port
    | \b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b             # IPv4[:port]
    | (?<![\w:])(?:[0-9a-f]{0,4}:){2,7}[0-9a-f]{1,4}\b # IPv6
    | \b(?=[\w.-]*[a-z])[a-z0-9_-]+(?:\.[a-z0-9_-]+)*:\d{2,5}\b  # host:port
    | \b(?:server|host(?:\s+name)?)\s+(?:at\s+)?"[^"]*"(?:\s*(?:\([^)]*\)))?(?:,\s*port\s+\d+)?  # psycopg2
""", re.I | re.X)
_SQL = re.compile(r"\s*(?:\[SQL:|\[parameters:|\(Background on this error|\b(?:SELECT|INSERT INTO|UPDATE|DELETE "
                  r"FROM|CREATE|DROP|ALTER)\s).*", re.S)
REDACTED = "<internal address>"


def redact(text: str) -> str:
    """``text`` without internal host names, addresses and SQL: what a reason may show a client."""
    return _ADDRESSES.sub(REDACTED, _SQL.sub("", text)).strip() or "internal error"
