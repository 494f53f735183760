"""What every backend serving an OCR vision-language model shares: its profile, and reading answers.

The backends (``vllm_server``, ``vllm_inprocess``, ``transformers_backend``) differ only in how a
prompt reaches the model; the image size they want, the default capacity and the way an answer
becomes an ``EngineOutput`` come from the model profile, once, here.
"""

from __future__ import annotations

from paperlane.errors import PaperlaneError
from paperlane.models.engine import Capacity, EngineOutput, EngineRequest, InputSpec, Outcome
from paperlane.models.profiles import Profile, get_profile
from paperlane.schemas import Usage
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
        return Capacity.continuous(self._cfg.max_in_flight)

    def _read(self, req: EngineRequest, raw: str, *, finish_reason: str | None, prompt_tokens: int,
              completion_tokens: int, seconds: float) -> Outcome:
        """The model's answer to ``req`` as an outcome: parsed output, or the error parsing raised."""
        try:
            out: EngineOutput = self._profile.parse(raw, req.spec, image_width=req.image.width,
                                                    image_height=req.image.height, finish_reason=finish_reason)
        except PaperlaneError as exc:
            return exc
        out.usage = Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
        out.seconds = seconds
        return out
