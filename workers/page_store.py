"""A page's stored objects, built and written off the process that feeds the engine.

The store step of an attempt (``pipeline.store_result``) has two halves: the objects (the annotated image drawn on
the page's preview and its upload, the result serialised to JSON and its upload) and the rows. The objects need no
engine connection and no database, only the CPU and a store client, so they run here, in a CPU pool process
(``cpu_pool.CpuPool.store``, which holds a store client already); the rows stay with the attempt, after the
objects (a row never points at an object that is not there). Writing a page's objects twice writes the same keys:
harmless.

Whatever goes wrong comes back as the page's ``Stored`` error, never as an exception: a third-party one might not
survive the trip back between processes.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass

import numpy as np

from paperlane import formats
from paperlane.errors import INTERNAL_REASON, PaperlaneError
from paperlane.schemas import OutputFormat, PageResult, Stage
from paperlane.settings import ImageFormat
from paperlane.storage.objects import ObjectStore, annotated_key, result_key


@dataclass(frozen=True)
class Stored:
    """What storing a page's objects did: their keys (``annotated_key`` None: no preview, no image), the annotated
    image when it was asked back, the store seconds its JSON records (drawing and storing the image); or the
    error, and for a bug its traceback as text."""

    json_key: str | None
    annotated_key: str | None = None
    image: bytes | None = None
    seconds: float = 0.0
    error: PaperlaneError | None = None
    traceback: str | None = None


def store_objects(store: ObjectStore, result: PageResult, preview: np.ndarray | None, *, fmt: ImageFormat,
                  timings: dict[str, float], image_back: bool = False) -> Stored:
    """Draw and store the annotated image (when there is a preview), then the result's JSON, its ``timings`` with
    this step's seconds (rendering and the image's upload) under ``store``. ``image_back``: return the image's
    bytes too (``paperlane run`` writes them beside the results). Never raises."""
    t0 = time.perf_counter()
    try:
        image_key, image = None, None
        if preview is not None:
            image = formats.build(fmt, formats.Content([result], preview=preview), page=result.page)
            image_key = annotated_key(result.job_id, fmt)
            store.put(image_key, image, content_type=formats.media_type(fmt))
        seconds = time.perf_counter() - t0
        result.timings = {**timings, Stage.STORE.value: seconds}
        json_key = result_key(result.job_id)
        store.put(json_key, formats.build(OutputFormat.JSON, formats.Content([result]), page=result.page),
                  content_type=formats.media_type(OutputFormat.JSON))
        return Stored(json_key, image_key, image if image_back else None, seconds)
    except PaperlaneError as exc:
        exc.stage = exc.stage or Stage.STORE.value
        return Stored(None, seconds=time.perf_counter() - t0, error=exc)
    except Exception:  # a bug: this page fails with a short reason and the attempt logs the traceback
        return Stored(None, seconds=time.perf_counter() - t0,
                      error=PaperlaneError(INTERNAL_REASON, stage=Stage.STORE.value), traceback=traceback.format_exc())
