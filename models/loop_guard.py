"""The loop guard: every answer streamed, a degenerate one stopped at once, tried again, then a fallback.

Shared by the vLLM engines (server and in-process). Each supplies one primitive, a ``StreamFn``: the
answer to a request with the given sampling settings as an async iterator of ``Delta`` (text, its
tokens' log-probabilities, the usage so far, the finish reason). Closing the iterator abandons the
request, and the engine frees its sequence at once (vLLM aborts a request whose client went away).
``LoopGuard.answer`` applies the policy (settings ``engine.guard``):

1. the answer is read with the profile's sampling, each piece fed to a ``DegenerationDetector``
   (models/degeneration.py); a degenerate answer is abandoned as soon as it is seen;
2. it is read again at once, ``retries`` times, with ``retry_repetition_penalty`` and
   ``retry_temperature``;
3. still degenerate: a text task (spotting, parse, text) gets the embedded RapidOCR engine's reading
   of the same prepared page, marked as a fallback (``EngineOutput.engine.fallback_for``, flag
   ``fallback``); another task (fields, translation, table, formula, chart) ends with what it has, the
   answer up to where it degenerated, flagged ``loop_stopped``.

Nothing degenerate passes as a clean result: every outcome is graded (models/quality.py), its confidence
the geometric mean probability of its tokens where the engine returned log-probabilities. ``answer`` is
one engine call in the pipeline's terms (one attempt at the page, however many requests it made);
``Usage.engine_calls`` and ``Usage.abandoned_tokens`` say what it cost, and the Prometheus counter
``paperlane_engine_tokens{outcome}`` counts every token decoded, completed or abandoned.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from paperlane.errors import EngineError, EngineOutputError
from paperlane.metrics import ENGINE_CHUNKS, ENGINE_TOKENS
from paperlane.models.degeneration import DegenerationDetector, Verdict
from paperlane.models.engine import EngineOutput, EngineRequest, Outcome, PreparedImage
from paperlane.models.profiles import Profile
from paperlane.models.quality import confidence_of, grade
from paperlane.models.vlm import read_answer
from paperlane.schemas import EngineInfo, QualityFlag, TaskSpec, Usage
from paperlane.settings import EngineSettings

log = logging.getLogger(__name__)


@dataclass
class Delta:
    """One streamed piece of an answer."""

    text: str = ""
    logprobs: Sequence[float] = ()  # of this piece's tokens, where the engine returns them
    finish_reason: str | None = None  # on the last piece: "stop" or "length"
    prompt_tokens: int | None = None
    completion_tokens: int | None = None  # of the whole answer so far, where the engine reports it


StreamFn = Callable[[EngineRequest, dict[str, Any]], AsyncGenerator[Delta, None]]


@dataclass
class Reading:
    """One answer read from the engine, to its end or until it degenerated."""

    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    logprob_sum: float = 0.0
    logprob_count: int = 0
    verdict: Verdict | None = None  # why it is degenerate
    abandoned: bool = False  # stopped mid-stream (the engine freed its sequence)
    pieces: list[str] = field(default_factory=list, repr=False)

    @property
    def confidence(self) -> float | None:
        return confidence_of(self.logprob_sum, self.logprob_count)

    def add(self, delta: Delta, *, pieces: int) -> None:
        self.logprob_sum += sum(delta.logprobs)
        self.logprob_count += len(delta.logprobs)
        self.prompt_tokens = delta.prompt_tokens or self.prompt_tokens
        # Tokens decoded: the engine's count where it streams one, else one per log-probability, else a
        # piece per token (vLLM streams a token per chunk unless told otherwise).
        self.completion_tokens = delta.completion_tokens or self.logprob_count or pieces
        self.finish_reason = delta.finish_reason or self.finish_reason


class LoopGuard:
    """The loop policy above, for one engine (``engine_name``) serving ``profile``."""

    def __init__(self, cfg: EngineSettings, profile: Profile, *, engine_name: str) -> None:
        self._cfg = cfg
        self._guard = cfg.guard
        self._profile = profile
        self._engine_name = engine_name
        self._fallback = EmbeddedFallback(cfg)

    def close(self) -> None:
        self._fallback.close()

    async def answer(self, req: EngineRequest, stream: StreamFn, *, max_tokens: int) -> Outcome:
        """The page's outcome: a clean answer, a fallback reading or what a degenerate answer had, graded.

        Raises what ``stream`` raises (an unreachable engine, a refused request) for the caller to map.
        """
        t0 = time.perf_counter()
        reading = await self._read(req, stream, self._profile.sampling(req.spec, max_tokens=max_tokens))
        calls, abandoned, flags = 1, 0, set()
        while reading.verdict is not None and calls <= self._guard.retries:
            log.info("page answer degenerated (%s) after %d tokens: trying again with repetition penalty %g",
                     reading.verdict, reading.completion_tokens, self._guard.retry_repetition_penalty)
            abandoned += reading.completion_tokens
            flags.add(QualityFlag.RETRIED)
            retry = self._profile.sampling(req.spec, max_tokens=max_tokens, temperature=self._guard.retry_temperature,
                                           repetition_penalty=self._guard.retry_repetition_penalty)
            reading = await self._read(req, stream, retry)
            calls += 1
        if reading.verdict is None:
            usage = Usage(prompt_tokens=reading.prompt_tokens, completion_tokens=reading.completion_tokens,
                          engine_calls=calls, abandoned_tokens=abandoned)
            return self._graded(req, reading.text, reading, usage, flags, t0)
        if self._guard.fallback and req.spec.task.reads_text:
            usage = Usage(prompt_tokens=reading.prompt_tokens, engine_calls=calls,
                          abandoned_tokens=abandoned + reading.completion_tokens)
            return await self._fall_back(req, reading.verdict, usage, flags, t0)
        log.warning("page answer degenerated again (%s); the %s task has no fallback: keeping its %d characters "
                    "before the loop, flagged", reading.verdict, req.spec.task.value, reading.verdict.keep)
        usage = Usage(prompt_tokens=reading.prompt_tokens, completion_tokens=reading.completion_tokens,
                      engine_calls=calls, abandoned_tokens=abandoned)
        return self._graded(req, reading.text[: reading.verdict.keep], reading, usage,
                            flags | {QualityFlag.LOOP_STOPPED}, t0)

    async def _read(self, req: EngineRequest, stream: StreamFn, sampling: dict[str, Any]) -> Reading:
        """One answer, read until it ends or degenerates (then abandoned: the stream is closed at once)."""
        detector = DegenerationDetector.for_image(self._guard, width=req.image.width, height=req.image.height)
        reading = Reading()
        async with contextlib.aclosing(stream(req, sampling)) as deltas:
            async for delta in deltas:
                reading.pieces.append(delta.text)
                reading.add(delta, pieces=len(reading.pieces))
                if self._guard.enabled and (verdict := detector.feed(delta.text)) is not None:
                    reading.verdict, reading.abandoned = verdict, True
                    break
        reading.text = "".join(reading.pieces)
        if self._guard.enabled and reading.verdict is None:
            reading.verdict = detector.finish()
        ENGINE_TOKENS.labels("abandoned" if reading.abandoned else "completed").inc(reading.completion_tokens)
        ENGINE_CHUNKS.inc(len(reading.pieces))
        return reading

    def _graded(self, req: EngineRequest, raw: str, reading: Reading, usage: Usage, flags: set[QualityFlag],
                t0: float) -> Outcome:
        outcome = read_answer(self._profile, req, raw, finish_reason=reading.finish_reason, usage=usage,
                              seconds=time.perf_counter() - t0, confidence=reading.confidence,
                              min_confidence=self._cfg.min_confidence, flags=flags)
        if isinstance(outcome, EngineOutputError) and QualityFlag.LOOP_STOPPED in flags:
            # What a degenerate fields answer had holds no JSON object: no fields, all missing, flagged.
            out = EngineOutput(fields={}, missing_fields=list(req.spec.fields), raw=raw, usage=usage,
                               seconds=time.perf_counter() - t0)
            out.quality = grade(out, flags=flags, confidence=reading.confidence,
                                min_confidence=self._cfg.min_confidence)
            return out
        return outcome

    async def _fall_back(self, req: EngineRequest, verdict: Verdict, usage: Usage, flags: set[QualityFlag],
                         t0: float) -> Outcome:
        log.warning("page answer degenerated again (%s): reading the page with the embedded engine instead",
                    verdict)
        outcome = await asyncio.to_thread(self._fallback.read, req)
        if not isinstance(outcome, EngineOutput):
            return outcome
        rapid = self._fallback.info
        outcome.engine = EngineInfo(name=rapid.name, version=rapid.version, model=rapid.model,
                                    fallback_for=self._engine_name)
        outcome.usage = usage
        outcome.seconds = time.perf_counter() - t0
        confidence = outcome.quality.confidence if outcome.quality else None
        outcome.quality = grade(outcome, flags=flags | {QualityFlag.FALLBACK}, confidence=confidence,
                                min_confidence=self._cfg.min_confidence)
        return outcome


class EmbeddedFallback:
    """The embedded RapidOCR engine, for pages whose VLM answers keep degenerating.

    Built on first use (most workers never need it) and run one page at a time, on the prepared page the
    VLM read (its JPEG decoded to grey pixels), so its lines are in the same pixels as a VLM answer's.
    """

    def __init__(self, cfg: EngineSettings) -> None:
        self._cfg = cfg
        self._engine: Any = None
        self._lock = threading.Lock()

    @property
    def info(self) -> EngineInfo:
        from paperlane.models.rapid import RapidEngine

        return self._engine.info if self._engine is not None else RapidEngine().info

    def read(self, req: EngineRequest) -> Outcome:
        """RapidOCR's reading of ``req``'s page (blocking: call it off the event loop)."""
        import cv2
        import numpy as np

        from paperlane.models.rapid import RapidEngine

        encoded = req.image.encoded()
        if encoded is None:
            return EngineError("the fallback engine needs the prepared page", stage="inference")
        pixels = cv2.imdecode(np.frombuffer(encoded, np.uint8), cv2.IMREAD_GRAYSCALE)
        if pixels is None:
            return EngineError("the fallback engine cannot decode the prepared page", stage="inference")
        image = PreparedImage(width=pixels.shape[1], height=pixels.shape[0], original_width=req.image.original_width,
                              original_height=req.image.original_height, pixels=pixels)
        with self._lock:
            if self._engine is None:
                engine = RapidEngine(max_side=self._cfg.rapid_max_side, min_confidence=self._cfg.min_confidence,
                                     layout_model="off")  # a VLM's fallback page: its lines in geometric order
                engine.start()
                self._engine = engine
            [outcome] = self._engine.infer([EngineRequest(image=image, spec=TaskSpec(task=req.spec.task),
                                                          priority=req.priority)])
        return outcome

    def close(self) -> None:
        with self._lock:
            if self._engine is not None:
                self._engine.close()
                self._engine = None
