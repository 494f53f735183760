"""How a long-running paperlane process keeps its heap, once it has started (``after_start``).

Two costs that are not the work's own, measured in a worker at the h200 engine shape
(``benchmarks/engine_utilisation.py``):

- glibc hands a freed multi-megabyte buffer (mmap) or the free top of its heap (trim) back to the kernel, and the
  next page's buffers fault in again 4 kB at a time: 1,400 page faults and 3.5 ms of CPU per A4 page in a
  preprocessing process, an eighth of its work; a document's outputs (its original and its searchable PDF, a
  megabyte or more each) likewise (``keep_freed_memory``);
- Python's cyclic garbage collector walks every object a collection's generation holds, and the oldest holds
  everything imported at start-up (pydantic's, SQLAlchemy's, Celery's, boto3's, OpenCV's: 140,000 objects and
  more) though none of them will ever be garbage. A collection of that generation took 40-100 ms of CPU in a
  worker's feeding process, with the GIL held: the engine goes unfed meanwhile. Such collections come when
  enough objects have outlived the younger ones (in a short benchmark only during start-up; in a worker that
  runs for days, from time to time). ``gc.freeze()`` moves what start-up left into a generation never collected:
  the two the outputs service ran after it took 7 ms each. What pages allocate is collected as before.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc

# glibc's mallopt() parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def after_start() -> None:
    """Called once a process has imported and opened all it needs, before its first page: its freed buffers kept
    for the next page, and the objects start-up left out of the garbage collector's walks."""
    keep_freed_memory()
    gc.collect()  # start-up's own garbage goes now, not frozen in with the rest
    gc.freeze()


def keep_freed_memory() -> None:
    """Keep a page's freed buffers for the next page instead of handing them back to the kernel: buffers below
    32 MB come from the heap, and up to 64 MB of it stays free for reuse. Other C libraries: left alone."""
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c")).mallopt
    except (OSError, AttributeError, TypeError):
        return
    mallopt(_M_MMAP_THRESHOLD, 32 << 20)
    mallopt(_M_TRIM_THRESHOLD, 64 << 20)
