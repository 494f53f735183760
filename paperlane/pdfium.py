"""PDFium in one place: one lock for this process (it is not thread-safe, and a process may read page counts
(producer), render pages (worker threads preparing urgent pages) and write searchable PDFs at once), and what
its refusal to open a document means for the document's owner, said the same way at upload and in a worker."""

from __future__ import annotations

import re
import threading
from typing import TYPE_CHECKING, Any

from paperlane.errors import InputError

if TYPE_CHECKING:
    import pypdfium2

LOCK = threading.RLock()


def open_document(source: Any, *, stage: str) -> pypdfium2.PdfDocument:
    """``source`` (bytes, a path, a file object) opened by PDFium; call it holding ``LOCK``.

    Raises InputError (``stage``) saying why it cannot be: encrypted (its password unknown, or a security
    handler PDFium lacks) or unreadable, with PDFium's own account."""
    import pypdfium2 as pdfium

    try:
        return pdfium.PdfDocument(source)
    except pdfium.PdfiumError as exc:
        raise _refusal(exc, stage) from None


def _refusal(exc: Exception, stage: str) -> InputError:
    """What PDFium's refusal to open a document means for its owner."""
    import pypdfium2.raw as pdfium_c

    code = getattr(exc, "err_code", None)
    if code == pdfium_c.FPDF_ERR_PASSWORD:
        return InputError("encrypted PDF (password required)", stage=stage)
    if code == pdfium_c.FPDF_ERR_SECURITY:
        return InputError("encrypted PDF (unsupported security handler)", stage=stage)
    return InputError(f"unreadable PDF ({reason(exc)})", stage=stage)


def reason(exc: Exception) -> str:
    """PDFium's own short account, on one line ("PDFium: Data format error")."""
    found = re.search(r"PDFium: [^)]*", str(exc))
    return found.group(0) if found else " ".join(str(exc).split())[:120].rstrip(".")
