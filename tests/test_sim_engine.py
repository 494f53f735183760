"""The simulated engine behaves as the vLLM server it stands in for: slots, queue order, errors, its log.

Assertions read the server's own stats and request log (its clock, one process), never how long
the test took: the machine is noisy, the server's bookkeeping is not.
"""

from __future__ import annotations

import base64
import json
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from paperlane.models.engine import EngineOutput, EngineRequest
from paperlane.models.profiles import get_profile
from paperlane.models.vllm_server import VllmServerEngine
from paperlane.schemas import Task, TaskSpec
from paperlane.settings import EngineSettings
from paperlane.workers.input_limits import Limits
from tests.pages import prepare, render_page, sample_lines, tiny_page
from tests.sim_engine import SimEngine, start_sim_engine

PROFILE = get_profile("hunyuanocr-1.0")


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[Callable[..., SimEngine]]:
    started: list[SimEngine] = []

    def start(**options: Any) -> SimEngine:
        engine = start_sim_engine(tmp_path / f"sim{len(started)}", **{"slots": 2, "latency": 0.3, **options})
        started.append(engine)
        return engine

    yield start
    for engine in started:
        engine.stop()


def body(page: int, *, spec: TaskSpec | None = None, **extra: Any) -> dict[str, Any]:
    """A chat request as paperlane's client sends it, for a small page numbered ``page``."""
    url = f"data:image/png;base64,{base64.b64encode(tiny_page(page)).decode()}"
    spec = spec or TaskSpec()
    return {"model": "tencent/HunyuanOCR", "messages": PROFILE.messages(spec, url),
            **PROFILE.sampling(spec, max_tokens=4096), **extra}


def post(engine: SimEngine, payload: dict[str, Any], timeout: float = 30) -> httpx.Response:
    return engine.http.post(f"{engine.url}/chat/completions", json=payload, timeout=timeout)


def post_in_background(engine: SimEngine, payload: dict[str, Any]) -> threading.Thread:
    thread = threading.Thread(target=post, args=(engine, payload))
    thread.start()
    return thread


def test_slots_run_at_once_and_the_rest_wait_for_a_free_one(sim: Callable[..., SimEngine]) -> None:
    engine = sim(slots=2, latency=0.5)
    threads = [post_in_background(engine, body(i)) for i in range(4)]
    for thread in threads:
        thread.join()
    stats = engine.stats()
    assert stats["completed"] == 4 and stats["peak_running"] == 2 and stats["peak_waiting"] >= 1
    log = sorted(engine.requests(), key=lambda r: r["start"])
    assert all(r["status"] == 200 and r["end"] - r["start"] >= 0.5 for r in log)
    first_free = min(r["end"] for r in log[:2])
    assert all(r["start"] >= first_free for r in log[2:])  # the last two waited for a slot
    assert stats["busy_slot_seconds"] == pytest.approx(sum(r["end"] - r["start"] for r in log), abs=0.01)


def _arrived(count: int) -> Callable[[dict[str, Any]], bool]:
    return lambda stats: bool(stats["requests"] >= count)


def _served_after_a_blocker(engine: SimEngine, payloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Occupy the only slot, queue ``payloads`` one by one (each after the server saw the last), let
    them all run; their log records in the order they were served."""
    threads = [post_in_background(engine, body(0))]
    for n, payload in enumerate(payloads, 1):
        engine.wait_for(_arrived(n))
        threads.append(post_in_background(engine, payload))
    for thread in threads:
        thread.join()
    blocker, *served = sorted(engine.requests(), key=lambda r: r["start"])
    assert all(r["arrival"] < blocker["end"] for r in served), "too slow to queue them behind the blocker"
    return served


@pytest.mark.slow
def test_priority_scheduling_serves_the_lowest_priority_first_then_arrival(sim: Callable[..., SimEngine]) -> None:
    engine = sim(slots=1, latency=0.8, scheduling_policy="priority")
    priorities = [5, 3, 9, 1, 3]
    served = [(r["priority"], r["n"]) for r in
              _served_after_a_blocker(engine, [body(10 + i, priority=p) for i, p in enumerate(priorities)])]
    assert served == sorted(served), served  # by priority, ties by arrival (n counts arrivals)
    assert [p for p, _ in served] == [1, 3, 3, 5, 9]


@pytest.mark.slow
def test_fcfs_serves_in_arrival_order(sim: Callable[..., SimEngine]) -> None:
    engine = sim(slots=1, latency=0.8)
    arrivals = [r["n"] for r in _served_after_a_blocker(engine, [body(10 + i) for i in range(4)])]
    assert arrivals == sorted(arrivals)


def test_refusals_are_vllms(sim: Callable[..., SimEngine]) -> None:
    engine = sim(max_model_len=512)
    too_long = post(engine, body(1))  # the client's max_tokens=4096
    assert too_long.status_code == 400
    assert too_long.json() == {"error": {
        "message": "max_tokens=4096 cannot be greater than max_model_len=512. Please request fewer output tokens. "
                   "(parameter=max_tokens, value=4096)",
        "type": "BadRequestError", "param": "max_tokens", "code": 400}}
    engine = sim()
    urgent = post(engine, body(1, priority=2))
    assert urgent.status_code == 400
    assert urgent.json()["error"]["message"] == "Got priority 2 but Priority scheduling is not enabled."
    assert post(engine, body(1, model="another/model")).status_code == 404
    assert post(engine, body(1, priority=0)).status_code == 200  # priority 0 is everyone's default
    stats = engine.stats()
    assert (stats["requests"], stats["rejected"], stats["completed"]) == (3, 2, 1)
    assert sum(stats["per_image"].values()) == 1  # refused requests never reached the engine
    assert [r["status"] for r in engine.requests()] == [400, 404, 200]


def test_models_health_and_answers_fit_the_production_client(sim: Callable[..., SimEngine]) -> None:
    engine = sim(max_model_len=4096, served_model_name="hunyuan-ocr")
    models = engine.http.get(f"{engine.url}/models").json()
    assert models["data"][0]["id"] == "hunyuan-ocr" and models["data"][0]["max_model_len"] == 4096
    client = VllmServerEngine(EngineSettings(kind="vllm", url=engine.url))
    client.start()
    try:
        image = prepare(render_page(sample_lines(1, 30), fmt="JPEG"), client.input_spec, Limits())
        specs = [TaskSpec(), TaskSpec(task=Task.PARSE), TaskSpec(task=Task.FIELDS, fields=("total", "date"))]
        spotting, parse, fields = client.infer([EngineRequest(image=image, spec=spec) for spec in specs])
    finally:
        client.close()
    assert isinstance(spotting, EngineOutput) and not spotting.truncated
    assert 36 <= len(spotting.lines) <= 44
    for line in spotting.lines:
        assert line.quad is not None
        assert all(0 <= x <= image.width and 0 <= y <= image.height for x, y in line.quad)
    assert isinstance(parse, EngineOutput) and parse.markdown and parse.markdown.startswith("# ")
    assert isinstance(fields, EngineOutput) and set(fields.fields or {}) == {"total", "date"}
    assert [r["task"] for r in sorted(engine.requests(), key=lambda r: r["n"])] == ["spotting", "parse", "fields"]


def test_an_answer_over_the_token_budget_is_cut_and_says_so(sim: Callable[..., SimEngine]) -> None:
    engine = sim()
    answer = post(engine, body(1, max_tokens=50)).json()
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == 50


def test_a_client_that_goes_away_aborts_its_request(sim: Callable[..., SimEngine]) -> None:
    engine = sim(slots=1, latency=1.0)
    with pytest.raises(httpx.ReadTimeout):
        post(engine, body(1), timeout=0.3)
    stats = engine.wait_for(lambda s: s["aborted"] == 1)
    assert stats["running"] == 0  # the slot is free again
    assert [r["status"] for r in engine.requests()] == [499]


def test_the_log_counts_engine_calls_per_page_even_after_a_kill(sim: Callable[..., SimEngine]) -> None:
    engine = sim(slots=4, latency=0.05)
    for page, times in ((1, 1), (2, 3), (3, 2)):
        for _ in range(times):
            assert post(engine, body(page)).status_code == 200
    counts = sorted(engine.stats()["per_image"].values())
    engine.stop(signal.SIGKILL)
    log = engine.requests()
    per_image: dict[str, int] = {}
    for record in log:
        per_image[record["image"]] = per_image.get(record["image"], 0) + 1
    assert sorted(per_image.values()) == counts == [1, 2, 3]
    assert all(r["status"] == 200 and r["arrival"] <= r["start"] < r["end"] for r in log)


@pytest.mark.parametrize("name", ["hunyuanocr-1.0", "hunyuanocr-1.5", "generic"])
def test_every_profiles_prompts_are_recognised(name: str) -> None:
    from tests.sim_model import read_prompt

    profile = get_profile(name)
    for task in Task:
        spec = TaskSpec(task=task, fields=("total", "date") if task is Task.FIELDS else (), target_language="en")
        prompt = read_prompt(profile.prompt(spec))
        assert prompt.task is task, (name, task)
        assert prompt.json_spotting == (task is Task.SPOTTING and name != "hunyuanocr-1.0")
        if task is Task.FIELDS:
            assert prompt.fields == ("total", "date")


def test_the_shaped_engine_streams_answers_of_their_own_length_and_frees_an_abandoned_slot(
        sim: Callable[..., SimEngine]) -> None:
    engine = sim(shape="fast", slots=None)
    stream: dict[str, Any] = {"stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True},
              "logprobs": True}
    lengths = []
    for page in range(3):
        with engine.http.stream("POST", f"{engine.url}/chat/completions", json=body(page, **stream)) as resp:
            events = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert chunks[-1]["choices"] == [] and chunks[-2]["choices"][0]["finish_reason"] == "stop"
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
        tokens = sum(len((c["choices"][0]["logprobs"] or {}).get("content", ())) for c in chunks if c["choices"])
        assert tokens == chunks[-1]["usage"]["completion_tokens"] and len(text) <= 3 * tokens
        assert all("usage" in c for c in chunks[1:])  # continuous usage stats
        lengths.append(tokens)
    assert len(set(lengths)) == 3 and all(150 <= n <= 2001 for n in lengths)  # each page its own length
    with engine.http.stream("POST", f"{engine.url}/chat/completions", json=body(9, **stream)) as resp:
        next(resp.iter_lines())  # the first chunk, then the client goes away
    stats = engine.wait_for(lambda s: s["aborted"] == 1 and s["running"] == 0, timeout=2)
    assert stats["tokens"]["completed"] == sum(lengths) and 0 <= stats["tokens"]["abandoned"] < 1000
    assert stats["pages"] == 4 and stats["loop_pages"] == 0
