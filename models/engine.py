"""The one interface every OCR engine implements.

An engine is built once per process and kept resident. It says how it wants its pages prepared
(``input_spec``: size, encoding) and batched (``capacity``), takes micro-batches of pages prepared
that way, and gives back one outcome per page: an ``EngineOutput`` or the ``PaperlaneError`` that
page hit. A failing page never fails its neighbours in the batch.

Coordinates: ``EngineOutput.lines[*].quad`` are in pixels of the PREPARED image the engine was
given; ``PreparedImage.to_original`` maps them back to the original page.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

from paperlane.errors import PaperlaneError
from paperlane.regions import Found
from paperlane.schemas import EngineInfo, Line, Point, Quality, TaskSpec, Usage


@dataclass(frozen=True)
class InputSpec:
    """How an engine wants its pages: the CPU pool produces exactly this.

    ``encoding="array"`` hands over decoded BGR pixels (in-process engines); "jpeg"/"png" hands
    over encoded bytes ready to send (server engines). The image is scaled, keeping its aspect
    ratio, so that its longer side is at most ``max_side`` and its pixel count at most
    ``max_pixels``; it is scaled up to ``min_pixels``; each side is then rounded to a multiple of
    ``multiple_of``. The sizes are caps: a page may come out somewhat smaller when a cheap JPEG
    decode gets it close enough (``min_decode_ratio``).
    """

    encoding: Literal["array", "jpeg", "png"] = "array"
    max_side: int = 2000
    max_pixels: int | None = None
    min_pixels: int | None = None
    multiple_of: int = 1
    jpeg_quality: int = 92
    grayscale: bool = False  # the engine reads text, not colour: decode luminance only (2-3x cheaper)
    # A JPEG may be decoded at 1/2, 1/4 or 1/8 scale in the DCT domain (several times cheaper than
    # decoding it whole and shrinking it) when that gives at least this share of the target side.
    min_decode_ratio: float = 0.85
    # The engine sends the encoded image as base64 (a data URL): the pool encodes it so (``PreparedImage.data_b64``,
    # in place of ``data``), not the process feeding the engine (~0.8 ms of its CPU for an A4 page's 430 kB).
    base64: bool = False


@dataclass(frozen=True)
class Capacity:
    """How an engine wants its work: pages per micro-batch, and how many batches it runs at once.

    A sequential engine (RapidOCR, transformers) runs one batch at a time; a server with
    continuous batching (vLLM) takes new requests while others run, so an interactive page need
    not wait for the batch in flight.
    """

    batch_size: int = 1
    batches_in_flight: int = 1

    @classmethod
    def continuous(cls, max_in_flight: int) -> Capacity:
        """For a continuously batching server: up to ``max_in_flight`` requests there, each sent on its own.

        The server forms the batches (vLLM adds a request to the running batch at its next step), so
        the worker sends every page as soon as it is ready and a place is free. Grouping pages first
        would only add waits: a group waits to fill, and holds its places until its slowest page is back.
        """
        return cls(batch_size=1, batches_in_flight=max(1, max_in_flight))


@dataclass
class PreparedImage:
    """A page ready for the engine, and how to map its pixels back to the original."""

    width: int
    height: int
    original_width: int
    original_height: int
    pixels: np.ndarray | None = None  # BGR uint8, when encoding == "array"
    data: bytes | None = None  # encoded image, when encoding is "jpeg" or "png" (and not ``base64``)
    data_b64: bytes | None = None  # the encoded image in base64, in place of ``data``, when the InputSpec asks
    mime: str | None = None

    def encoded(self) -> bytes | None:
        """The encoded image's bytes, from ``data`` or ``data_b64``; None for pixels."""
        return self.data if self.data is not None else base64.b64decode(self.data_b64) if self.data_b64 else None

    def to_original(self, point: Point) -> Point:
        """Map a point in prepared-image pixels to original-image pixels."""
        sx = self.original_width / self.width
        sy = self.original_height / self.height
        return (round(point[0] * sx, 1), round(point[1] * sy, 1))


@dataclass
class EngineRequest:
    image: PreparedImage
    spec: TaskSpec = field(default_factory=TaskSpec)
    # The page's message priority (0 first): engines that queue requests (vLLM with
    # ``--scheduling-policy priority``) serve lower numbers first, so an interactive page
    # overtakes the batch backlog inside the engine too.
    priority: int = 0
    # An interactive page: engines that bound their requests in flight let it past that bound at once.
    urgent: bool = False


@dataclass
class EngineOutput:
    """What an engine read on one page (coordinates in prepared-image pixels)."""

    text: str = ""
    lines: list[Line] = field(default_factory=list)
    markdown: str | None = None
    fields: dict[str, object] | None = None
    missing_fields: list[str] = field(default_factory=list)
    truncated: bool = False
    usage: Usage | None = None
    raw: str | None = None  # the model's raw answer, where there is one
    seconds: float | None = None  # this page's own inference time, when the engine knows it
    quality: Quality | None = None  # the engine's grade of this output (models/quality.py)
    engine: EngineInfo | None = None  # set when another engine than the worker's read the page (a fallback)
    regions: list[Found] = field(default_factory=list)  # layout regions a layout model found (the embedded engine)


Outcome = EngineOutput | PaperlaneError


class Engine(Protocol):
    """An OCR engine, resident for the life of a worker process."""

    @property
    def info(self) -> EngineInfo:
        """Name, version and model of this engine, recorded on every result."""
        ...

    @property
    def input_spec(self) -> InputSpec:
        """How pages must be prepared for ``infer``."""
        ...

    @property
    def capacity(self) -> Capacity:
        """The micro-batch size and batches in flight this engine works best with."""
        ...

    def start(self) -> None:
        """Load the model (or wait for the server) and warm it up.

        Raises ``EngineUnavailable`` when a server does not become ready in time and
        ``UsageError`` when the engine is misconfigured (missing model, unknown profile).
        """
        ...

    def infer(self, requests: Sequence[EngineRequest]) -> list[Outcome]:
        """Run one micro-batch; return one outcome per request, in order.

        Never raises for a single page's failure: that page's outcome is the error. Raises
        ``EngineUnavailable`` only when the whole engine is gone.
        """
        ...

    def close(self) -> None:
        """Release the model, connections and threads. Safe to call twice."""
        ...
