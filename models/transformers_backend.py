"""The plain PyTorch path: an OCR VLM through Hugging Face transformers, for development and comparison.

The seed deployment's reference (HunyuanOCR at ~600 ms per page with plain PyTorch, one page at a
time). Here a micro-batch is one padded ``generate`` call per task. Weights load from a local
folder only (``local_files_only``): nothing is downloaded at run time.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Sequence
from importlib.metadata import version
from typing import Any

from paperlane.errors import EngineError, PaperlaneError, UsageError
from paperlane.models.engine import Capacity, EngineRequest, Outcome
from paperlane.models.images import to_pil
from paperlane.models.vlm import VlmEngineBase
from paperlane.schemas import EngineInfo
from paperlane.settings import EngineSettings

log = logging.getLogger(__name__)

_STAGE = "inference"


class TransformersEngine(VlmEngineBase):
    def __init__(self, cfg: EngineSettings) -> None:
        if not cfg.model:
            raise UsageError("the transformers engine needs engine.model (--model DIR)")
        super().__init__(cfg)
        self._model: Any = None
        self._processor: Any = None
        self._torch: Any = None

    @property
    def info(self) -> EngineInfo:
        return EngineInfo(name="transformers", version=version("transformers"),
                          model=f"{self._cfg.model} ({self._profile.name})")

    @property
    def capacity(self) -> Capacity:
        return Capacity(batch_size=8, batches_in_flight=1)  # one padded generate() at a time

    def start(self) -> None:
        if self._model is not None:
            return
        try:
            import torch
            from transformers import AutoModelForImageTextToText, AutoProcessor
        except ImportError as exc:
            raise UsageError("the transformers engine needs torch and transformers installed") from exc
        t0 = time.perf_counter()
        device = self._cfg.device if self._cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = getattr(torch, self._cfg.dtype) if self._cfg.dtype != "auto" else (
            torch.bfloat16 if device.startswith("cuda") else torch.float32)
        try:
            self._processor = AutoProcessor.from_pretrained(self._cfg.model, local_files_only=True)
            self._model = AutoModelForImageTextToText.from_pretrained(
                self._cfg.model, dtype=dtype, local_files_only=True).to(device).eval()
        except (OSError, ValueError) as exc:
            raise UsageError(f"cannot load model from {self._cfg.model}: {str(exc).splitlines()[0][:200]}") from exc
        self._processor.tokenizer.padding_side = "left"  # batched generation continues on the right
        self._torch = torch
        log.info("transformers engine ready in %.1fs on %s: %s", time.perf_counter() - t0, device, self._cfg.model)

    def infer(self, requests: Sequence[EngineRequest]) -> list[Outcome]:
        if self._model is None:
            raise UsageError("engine not started")
        outcomes: list[Outcome | None] = [None] * len(requests)
        by_task: dict[str, list[int]] = defaultdict(list)
        for i, req in enumerate(requests):
            by_task[req.spec.cache_key()].append(i)
        for indices in by_task.values():
            for i, outcome in zip(indices, self._generate([requests[i] for i in indices])):
                outcomes[i] = outcome
        return [o for o in outcomes if o is not None]

    def _generate(self, reqs: list[EngineRequest]) -> list[Outcome]:
        spec = reqs[0].spec
        t0 = time.perf_counter()
        try:
            images = [to_pil(r.image) for r in reqs]
        except PaperlaneError as exc:
            return [exc] * len(reqs)
        prompt = self._processor.apply_chat_template(self._profile.messages(spec), tokenize=False,
                                                     add_generation_prompt=True)
        sampling = self._profile.sampling(spec, max_tokens=self._cfg.max_tokens)
        try:
            inputs = self._processor(text=[prompt] * len(reqs), images=images, padding=True,
                                     return_tensors="pt").to(self._model.device)
            with self._torch.inference_mode():
                out = self._model.generate(**inputs, max_new_tokens=sampling["max_tokens"], do_sample=False,
                                           repetition_penalty=sampling["repetition_penalty"])
        except (RuntimeError, ValueError) as exc:  # out of memory, bad input shapes
            log.exception("transformers generate failed")
            return [EngineError(f"transformers failed: {type(exc).__name__}", stage=_STAGE)] * len(reqs)
        seconds = (time.perf_counter() - t0) / len(reqs)
        new_tokens = out[:, inputs["input_ids"].shape[1]:]
        return [self._parse(req, tokens, seconds, int(inputs["input_ids"].shape[1]), int(sampling["max_tokens"]))
                for req, tokens in zip(reqs, new_tokens)]

    def _parse(self, req: EngineRequest, tokens: Any, seconds: float, prompt_len: int, limit: int) -> Outcome:
        eos = self._model.generation_config.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos])
        ids = [int(t) for t in tokens]
        ended = next((n for n, t in enumerate(ids) if t in eos_ids), None)
        generated = ids if ended is None else ids[:ended]
        pad = self._processor.tokenizer.pad_token_id
        generated = [t for t in generated if t != pad]
        finish = "stop" if ended is not None or len(generated) < limit else "length"
        raw = self._processor.tokenizer.decode(generated, skip_special_tokens=True)
        return self._read(req, raw, finish_reason=finish, prompt_tokens=prompt_len,
                          completion_tokens=len(generated), seconds=seconds)

    def close(self) -> None:
        self._model = None
        self._processor = None
