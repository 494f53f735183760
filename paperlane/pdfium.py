"""One lock for PDFium in this process: it is not thread-safe, and a process may read page counts
(producer), render pages (worker threads preparing urgent pages) and write searchable PDFs at once.
Every call into pypdfium2 holds ``LOCK``."""

from __future__ import annotations

import threading

LOCK = threading.RLock()
