"""What every backend serving an OCR vision-language model shares: its profile, and reading answers.

The backends (``vllm_server``, ``vllm_inprocess``, ``transformers_backend``) differ only in how a
prompt reaches the model; the image size they want, the default capacity and the way an answer
becomes a graded ``EngineOutput`` come from the model profile, once, here. The vLLM backends stream
their answers through the loop guard (``models.loop_guard``), which reads them with ``read_answer`` too.
"""

from __future__ import annotations

from collections.abc import Iterable

from paperlane.errors import PaperlaneError
from paperlane.models.engine import Capacity, EngineOutput, EngineRequest, InputSpec, Outcome
from paperlane.models.profiles import Profile, get_profile
from paperlane.models.quality import grade
from paperlane.schemas import QualityFlag, Usage
from paperlane.settings import EngineSettings


class VlmEngineBase:
    def __init__(self, cfg: EngineSettings) -> None:
        self._cfg = cfg
        self._profile: Profile = get_profile(cfg.profile)

    @property
    def input_spec(self) -> InputSpec:
        return self._profile.input_spec()

    @property
    def capacity(self) -> Capacity:
        # A fixed window (engine.window.start, within engine.max_in_flight): only the vLLM server's client has a
        # /metrics to follow (models/window.py) and plans its capacity from the cap instead.
        return Capacity.continuous(min(self._cfg.max_in_flight, self._cfg.window.start))

    def _read(self, req: EngineRequest, raw: str, *, finish_reason: str | None, prompt_tokens: int,
              completion_tokens: int, seconds: float) -> Outcome:
        """The model's answer to ``req`` as an outcome: parsed and graded output, or the error parsing raised."""
        return read_answer(self._profile, req, raw, finish_reason=finish_reason, seconds=seconds,
                           usage=Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens),
                           confidence=None, min_confidence=self._cfg.min_confidence)


def read_answer(profile: Profile, req: EngineRequest, raw: str, *, finish_reason: str | None, seconds: float,
                usage: Usage, confidence: float | None, min_confidence: float,
                flags: Iterable[QualityFlag] = ()) -> Outcome:
    """``raw`` (the model's answer to ``req``) parsed by ``profile`` and graded; or the error parsing raised."""
    try:
        out: EngineOutput = profile.parse(raw, req.spec, image_width=req.image.width,
                                          image_height=req.image.height, finish_reason=finish_reason)
    except PaperlaneError as exc:
        return exc
    out.usage = usage
    out.seconds = seconds
    out.quality = grade(out, flags=flags, confidence=confidence, min_confidence=min_confidence)
    return out
