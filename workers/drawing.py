"""When a page's annotated image is drawn: as the page finishes, or the first time someone asks for it.

Drawn as each page finishes (``worker.annotated`` stored), it costs every page a preview cut from its decode, a
drawing, a JPEG and an upload: a sixth of a worker's preprocessing pool's CPU (issue 26's profile) and one object
per page, for an image a person looks at on a few pages of a backlog of millions. So a worker leaves it undrawn
by default (on_request), and the API draws it the first time it is asked for, in one of its build processes
(``producer.api.builds``: bounded in CPU time and memory, spent from the tenant's build budget), with
``drawn_on_request``: the page's original read and prepared as a worker prepares it, for a preview only, and the
lines of its stored result. The API keeps what it drew (``storage.objects.drawn_key``), so a second ask is a read.
``paperlane run`` writes the image beside each page's JSON, so it draws it as the page finishes unless told not to.
"""

from __future__ import annotations

from paperlane import formats
from paperlane.errors import PaperlaneError
from paperlane.models.engine import InputSpec
from paperlane.schemas import PageResult
from paperlane.settings import Settings
from paperlane.storage.objects import ObjectStore
from paperlane.storage.tables import JobRow
from paperlane.workers.doccache import read_whole
from paperlane.workers.input_limits import Limits
from paperlane.workers.preprocess import prepare_page


def drawn_by_worker(settings: Settings, *, files: bool) -> bool:
    """Whether pages' annotated images are drawn as they finish (``worker.annotated``; unset: when the pages are
    written out as files, as ``paperlane run`` does)."""
    when = settings.worker.annotated
    return when == "stored" or (when is None and files)


def drawn_on_request(store: ObjectStore, job: JobRow, result: PageResult, settings: Settings) -> bytes:
    """The annotated image of ``job``'s page, drawn now with ``result``'s lines on a preview of its original (read
    from ``store`` and prepared as a worker prepares it, under the same limits), in ``worker.annotated_format``.
    Raises what reading or preparing the original raises (InputError, StorageError, ...)."""
    cfg = settings.worker
    if not job.original_key:
        raise PaperlaneError("the page's original is not stored", stage="store")
    limits = Limits(max_pixels=cfg.max_image_pixels, max_bytes=cfg.max_input_bytes)
    # Prepared at the preview's size, grey, undecoded beyond what it needs (a JPEG's DCT reduction, a PDF page
    # rendered small): the preview is all that is drawn on.
    spec = InputSpec(encoding="array", max_side=cfg.annotated_max_side, grayscale=True)
    page = prepare_page(read_whole(store, job.original_key, limits.max_bytes), spec, limits, page=job.page,
                        preview_side=cfg.annotated_max_side)
    return formats.build(cfg.annotated_format, formats.Content([result], preview=page.preview), page=result.page)
