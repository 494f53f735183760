"""A page's result and stored objects, built and written off the process that feeds the engine.

After the engine has answered, an attempt has three steps left: post-processing (the engine's output becomes the
page result: lines mapped back to the original's pixels, words laid out, blocks in reading order), the objects (the
annotated image drawn on the page's preview and its upload, the result serialised to JSON and its upload) and the
rows. The first two need no engine connection and no database, only the CPU and a store client, so they run here,
in a CPU pool process (``cpu_pool.CpuPool.finish``, which holds a store client already): the engine's output goes
there (a few kB), and what comes back is the result without its lines and blocks (they are in the stored JSON)
unless it is asked back whole (``paperlane run`` writes page files from it). The rows stay with the attempt, after
the objects (a row never points at an object that is not there). Writing a page's objects twice writes the same
keys: harmless.

Whatever goes wrong comes back as the page's ``Stored`` error, never as an exception: a third-party one might not
survive the trip back between processes.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from dataclasses import dataclass

import numpy as np

from paperlane import formats
from paperlane.errors import INTERNAL_REASON, PaperlaneError
from paperlane.models.engine import EngineOutput, PreparedImage
from paperlane.schemas import EngineInfo, OutputFormat, PageResult, Stage, TaskSpec
from paperlane.settings import ImageFormat, LayoutSettings
from paperlane.storage.line_stats import LineStats
from paperlane.storage.objects import ObjectStore, annotated_key, result_key
from paperlane.workers.postprocess import build_result


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
    json: bytes | None = None  # the result's JSON as stored, when asked back


def store_objects(store: ObjectStore, result: PageResult, preview: np.ndarray | None, *, fmt: ImageFormat,
                  timings: dict[str, float], image_back: bool = False, json_back: bool = False) -> Stored:
    """Draw and store the annotated image (when there is a preview), then the result's JSON, its ``timings`` with
    this step's seconds (rendering and the image's upload) under ``store``. ``image_back``: return the image's
    bytes too (``paperlane run`` writes them beside the results); ``json_back``: the JSON's. Never raises."""
    t0 = time.perf_counter()
    try:
        image_key, image = None, None
        if preview is not None:
            image = formats.build(fmt, formats.Content([result], preview=preview), page=result.page)
            image_key = annotated_key(result.job_id, fmt)
            store.put(image_key, image, content_type=formats.media_type(fmt))
        seconds = time.perf_counter() - t0
        result.timings = {**timings, Stage.STORE.value: seconds}
        json_key, json = result_key(result.job_id), formats.build(OutputFormat.JSON, formats.Content([result]),
                                                                  page=result.page)
        store.put(json_key, json, content_type=formats.media_type(OutputFormat.JSON))
        return Stored(json_key, image_key, image if image_back else None, seconds, json=json if json_back else None)
    except PaperlaneError as exc:
        exc.stage = exc.stage or Stage.STORE.value
        return Stored(None, seconds=time.perf_counter() - t0, error=exc)
    except Exception:  # a bug: this page fails with a short reason and the attempt logs the traceback
        return Stored(None, seconds=time.perf_counter() - t0,
                      error=PaperlaneError(INTERNAL_REASON, stage=Stage.STORE.value), traceback=traceback.format_exc())


@dataclass(frozen=True)
class Finish:
    """What building a page's result needs (``postprocess.build_result``): the engine's output, and the prepared
    image's geometry (its pixels and bytes left behind: ``geometry``) to map it back to the original's."""

    job_id: str
    source: str
    page: int
    spec: TaskSpec
    output: EngineOutput
    image: PreparedImage
    size: tuple[int, int]
    engine: EngineInfo
    layout: LayoutSettings | None = None

    @staticmethod
    def geometry(image: PreparedImage) -> PreparedImage:
        return dataclasses.replace(image, pixels=None, data=None, data_b64=None)


@dataclass
class Finished:
    """A page's result built and its objects stored: the ``Stored`` (with the JSON as stored when the result is not
    whole: a document's outputs read it); the result, whole when asked back, otherwise without its lines and blocks
    (in the stored JSON; ``lines`` has what the rows keep of them); the seconds the result took to build
    (post-processing). On an error, ``stored`` says it and ``result`` is None."""

    stored: Stored
    result: PageResult | None = None
    lines: LineStats | None = None
    seconds: float = 0.0


def finish_objects(store: ObjectStore, finish: Finish, preview: np.ndarray | None, *, fmt: ImageFormat,
                   timings: dict[str, float], image_back: bool = False, result_back: bool = False) -> Finished:
    """Build the page's result from the engine's output, then store its objects (``store_objects``, the build's
    seconds recorded under ``postprocess``). ``result_back``: return the result whole. Never raises."""
    t0 = time.perf_counter()
    try:
        result = build_result(job_id=finish.job_id, source=finish.source, page=finish.page, spec=finish.spec,
                              output=finish.output, image=finish.image, size=finish.size, engine=finish.engine,
                              layout=finish.layout)
    except Exception as exc:  # a bug (ours, or an engine's output we could not map): this page fails alone
        error = exc if isinstance(exc, PaperlaneError) else PaperlaneError(INTERNAL_REASON)
        error.stage = error.stage or Stage.POSTPROCESS.value
        return Finished(Stored(None, error=error, traceback=None if isinstance(exc, PaperlaneError)
                               else traceback.format_exc()), seconds=time.perf_counter() - t0)
    seconds = time.perf_counter() - t0
    stored = store_objects(store, result, preview, fmt=fmt, timings={**timings, Stage.POSTPROCESS.value: seconds},
                           image_back=image_back, json_back=not result_back)
    lines = LineStats.of(result)
    if not result_back:
        result = result.model_copy(update={"lines": [], "blocks": []})
    return Finished(stored, result, lines, seconds)
