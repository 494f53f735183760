"""The full pipeline on the real vLLM server: paperlane submit -> worker -> vLLM -> Postgres + S3."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import MAX_TOKENS, VllmServer

from tests.conftest import Stack, cli
from tests.pages import render_page, sample_lines
from tests.test_distributed import submit, wait_terminal

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_submit_worker_vllm_result(stack_factory, worker_factory, vllm_server: VllmServer, tmp_path: Path) -> None:
    stack: Stack = stack_factory(ENGINE__MAX_TOKENS=str(MAX_TOKENS), WORKER__BATCH_SIZE="4")
    paths = []
    for i in range(6):
        paths.append(tmp_path / f"page{i}.png")
        paths[-1].write_bytes(render_page(sample_lines(i)))
    worker = worker_factory(stack, "--engine", "vllm", "--engine-url", vllm_server.url,
                            "--profile", "hunyuanocr-1.0")
    ids = submit(stack, *paths)
    rows = wait_terminal(stack, ids)
    for job_id in ids:
        row = rows[job_id]
        assert row.status == "succeeded", row.error
        assert row.engine.startswith("vllm ")
        result = json.loads(stack.s3().get_object(Bucket=stack.bucket, Key=row.result_key)["Body"].read())
        assert result["truncated"] is True  # cut at max_tokens: flagged, never passed as complete
        assert result["usage"]["completion_tokens"] == MAX_TOKENS
        assert result["engine"]["name"] == "vllm" and "hunyuanocr-1.0" in result["engine"]["model"]
        assert result["timings"]["inference"] > 0
    assert worker.alive()
    text = cli(stack, "submit", "--task", "text", str(paths[0]))
    [row] = wait_terminal(stack, text.stdout.split()).values()
    assert row.status == "succeeded" and row.id not in ids  # another task on the same page is another job
