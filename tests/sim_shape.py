"""What the simulated engine (tests/sim_engine.py) models of a real GPU serving HunyuanOCR, in one place.

``SHAPES`` holds the engine profiles; the published figures behind ``h200-hunyuanocr``:

- answers: HunyuanOCR 1.5 on one RTX 4090 gave 172 to 1,836 output tokens per OmniDocBench page (mean
  about 660) at 277-423 tokens/s per request (median ~395): here a log-normal length per page with
  median 500 and spread 0.6 (mean ~600, 1 page in 100 past ~2,000), cut to 150..2,000, and 390 tokens/s
  for a sequence decoding alone;
- the GPU: one H100/H200 with continuous batching is estimated at 12-25 pages/s, bound by decoding. A
  ~0.5B language model reads its KV cache (~96 KiB per token) at every step, so past a few dozen
  sequences more of them share a fixed rate: here an aggregate ceiling of 12,000 tokens/s (~20 pages/s
  of ~600 tokens), each sequence at min(390, 12,000 / sequences decoding) tokens/s;
- ``max_num_seqs`` 40: the knee, where 40 sequences at 300 tokens/s reach the ceiling. More sequences
  would add latency and no throughput (vLLM's ``--max-num-seqs``); the rest wait, by priority;
- prefill: 20 ms plus the prompt's vision tokens (one per 32x32 pixels, ~2,900 for an A4 page at 2048
  px) at 30,000 tokens/s, ~0.12 s for an A4 page, during which the sequence holds its slot and decodes
  nothing. Its cost to the other sequences is inside the aggregate ceiling (a simplification);
- streaming: a chunk per sequence once its interval's tokens are ready: the request's ``stream_interval`` (a vLLM
  0.32 request field), never below the server's ``--stream-interval`` (``stream_interval``, 1 as vLLM's default);
  decode progress advanced every ``tick_s`` for all sequences at once, or as often as the shortest interval needs.

``fast`` is the same shape, sped up for tests (a page in ~0.1 s, a loop to 4,096 tokens in ~0.8 s).

``PageDraw`` is what the engine "decides" about one page, reproducibly from its image: the length of
its answer, whether it loops (a ``loop_share`` of pages, unless the request's ``repetition_penalty`` is
above ``loop_penalty``; a smaller ``stubborn_share`` loops whatever the penalty), where the loop starts
and what repeats, and its tokens' log-probabilities (lower on looping text; a ``hard_share`` of pages
are read with low confidence throughout).
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass

from paperlane.schemas import Task


@dataclass(frozen=True)
class EngineShape:
    name: str
    max_num_seqs: int  # sequences decoding at once (vLLM --max-num-seqs); the rest wait
    decode_tokens_per_s: float  # the aggregate ceiling over all sequences
    stream_tokens_per_s: float  # one sequence decoding alone
    prefill_s: float  # per request, fixed
    prefill_tokens_per_s: float  # prompt tokens (mostly vision tokens) per second, per request
    median_tokens: int  # answer length: log-normal
    spread: float  # sigma of ln(answer length)
    min_tokens: int
    max_tokens: int  # longest answer drawn (a loop runs past it, to the request's max_tokens)
    stream_interval: int  # the server's --stream-interval: tokens a streamed chunk at least (a request may ask more)
    tick_s: float  # decode progress is advanced this often (more often for chunks shorter than a tick's tokens)

    @property
    def mean_tokens(self) -> float:
        """The mean answer length (of the log-normal, ignoring the cut, ~1% off)."""
        return self.median_tokens * math.exp(self.spread**2 / 2)

    @property
    def pages_per_s(self) -> float:
        """Pages per second when saturated: the decode ceiling over the mean answer."""
        return self.decode_tokens_per_s / self.mean_tokens

    def prefill(self, prompt_tokens: int) -> float:
        """Seconds a request's prefill takes."""
        return self.prefill_s + prompt_tokens / self.prefill_tokens_per_s


SHAPES: dict[str, EngineShape] = {
    shape.name: shape
    for shape in (
        EngineShape("h200-hunyuanocr", max_num_seqs=40, decode_tokens_per_s=12_000, stream_tokens_per_s=390,
                    prefill_s=0.02, prefill_tokens_per_s=30_000, median_tokens=500, spread=0.6, min_tokens=150,
                    max_tokens=2000, stream_interval=1, tick_s=0.02),
        # The same model on a quarter of the accelerator (a quarter of its sequences and decode ceiling, each
        # stream as fast): ~5 pages/s, what a 2-core machine's CPU side can keep saturated. Benchmarks of
        # behaviour under saturation (priority, fairness) use it there; a whole H200 needs more cores to feed it.
        EngineShape("quarter-h200-hunyuanocr", max_num_seqs=10, decode_tokens_per_s=3_000, stream_tokens_per_s=390,
                    prefill_s=0.02, prefill_tokens_per_s=30_000, median_tokens=500, spread=0.6, min_tokens=150,
                    max_tokens=2000, stream_interval=1, tick_s=0.02),
        # A bigger server with a slower model: 80 sequences at 150 tokens/s each reach the same 12,000 tokens/s
        # ceiling, so it needs ~80 answers streaming at once (a fixed window of 32 fills it to ~0.4).
        EngineShape("wide-slow", max_num_seqs=80, decode_tokens_per_s=12_000, stream_tokens_per_s=150,
                    prefill_s=0.02, prefill_tokens_per_s=30_000, median_tokens=500, spread=0.6, min_tokens=150,
                    max_tokens=2000, stream_interval=1, tick_s=0.02),
        # The same width with slower, shorter answers (~3 s each, ~26 pages/s), for tests of the window.
        EngineShape("wide-slow-short", max_num_seqs=80, decode_tokens_per_s=4_000, stream_tokens_per_s=50,
                    prefill_s=0.02, prefill_tokens_per_s=30_000, median_tokens=150, spread=0.3, min_tokens=80,
                    max_tokens=300, stream_interval=1, tick_s=0.05),
        EngineShape("fast", max_num_seqs=8, decode_tokens_per_s=40_000, stream_tokens_per_s=5_000,
                    prefill_s=0.002, prefill_tokens_per_s=2_000_000, median_tokens=500, spread=0.6, min_tokens=150,
                    max_tokens=2000, stream_interval=1, tick_s=0.01),
    )
}


@dataclass(frozen=True)
class Behaviour:
    """How the simulated model misbehaves: the shares of pages it loops on, is stubborn on, is unsure of."""

    loop_share: float = 0.0
    stubborn_share: float = 0.0  # of all pages: loops even with a stronger penalty (at most loop_share)
    loop_penalty: float = 1.1  # a request with a repetition_penalty above this breaks the loop
    hard_share: float = 0.0


# Logprobs: most tokens near-certain, a few unsure; looping text and hard pages much less sure.
_SURE, _UNSURE = -0.02, -0.9
_UNSURE_EVERY = {"normal": 20, "hard": 2, "loop": 3}


@dataclass(frozen=True)
class PageDraw:
    """What the model does with one page (image and task), drawn reproducibly from them."""

    tokens: int  # the answer's length when it does not loop
    loops: bool  # falls into a loop at the usual repetition penalty
    stubborn: bool  # loops whatever the penalty
    hard: bool  # read with low confidence
    loop_at: float  # where in the answer the loop starts (share of its text)
    loop_kind: int  # which unit repeats (see sim_engine.loop_answer)
    salt: int

    @classmethod
    def of(cls, image: str, task: Task, shape: EngineShape, behaviour: Behaviour) -> PageDraw:
        rnd = random.Random(hashlib.sha1(f"{image}:{task.value}".encode()).digest())
        tokens = round(rnd.lognormvariate(math.log(shape.median_tokens), shape.spread))
        u = rnd.random()
        return cls(tokens=min(max(tokens, shape.min_tokens), shape.max_tokens), loops=u < behaviour.loop_share,
                   stubborn=u < min(behaviour.stubborn_share, behaviour.loop_share),
                   hard=rnd.random() < behaviour.hard_share, loop_at=rnd.uniform(0.1, 0.6),
                   loop_kind=rnd.randrange(4), salt=rnd.randrange(1 << 30))

    def looping(self, repetition_penalty: float, behaviour: Behaviour) -> bool:
        """Whether this request loops: a looping page unless its penalty is strong enough, a stubborn one always."""
        return self.stubborn or (self.loops and repetition_penalty <= behaviour.loop_penalty)

    def logprob(self, token: int, *, looping: bool) -> float:
        """The log-probability of the answer's ``token``-th token (deterministic)."""
        every = _UNSURE_EVERY["loop" if looping else "hard" if self.hard else "normal"]
        return _UNSURE if (token * 2654435761 + self.salt) % every == 0 else _SURE
