"""Schemathesis against a real ``paperlane api`` on real Redis, PostgreSQL and S3: every operation of the API's own
OpenAPI document, with inputs generated from it (coverage, then fuzzing: NUL bytes, non-finite numbers, odd methods,
missing and extra fields), with a valid key of one tenant; a second run pins the path's ids to another tenant's
document, page and ingest. No answer may be a 5xx, and every answer must conform to the document: its status code
listed, its body and headers as described, 405 with an Allow header, valid input accepted, invalid refused.

``PAPERLANE_FUZZ_EXAMPLES`` sets the examples per operation (default 20; a longer run: 500)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.api_server import ApiProcess, create_key
from tests.conftest import Stack
from tests.pages import tiny_page

pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("PAPERLANE_FUZZ_EXAMPLES", "20"))
# Limits a fuzzer would otherwise spend in seconds (its requests are still bounded and counted).
_OVERRIDES = {"API__RATE_PER_MINUTE": "100000", "API__TENANT_RATE_PER_MINUTE": "100000",
              "API__AUTH_FAILURES_PER_MINUTE": "100000", "API__MAX_WAIT": "1", "API__STREAM_SECONDS": "1"}


CONFIG = Path(__file__).with_name("schemathesis.toml")  # what the schema cannot say, and why


def _schemathesis(api: ApiProcess, key: str, out: Path, config: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "run", f"{api.url}/openapi.json",
               "-H", f"Authorization: Bearer {key}", "--checks", "all", "--exclude-checks",
               "ignored_auth,use_after_free,ensure_resource_availability",
               "--max-examples", str(EXAMPLES), "--seed", "25", "--workers", "2", "--request-timeout", "20",
               "--suppress-health-check", "all", "--continue-on-failure", "--no-color", *extra]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800, cwd=out)
    (out / f"schemathesis-{config.stem}.txt").write_text(done.stdout + done.stderr)  # the whole report, kept
    return done


def test_every_operation_answers_within_its_schema(stack_factory: type, tmp_path: Path) -> None:
    stack: Stack = stack_factory(**_OVERRIDES)
    api = ApiProcess.of(stack).wait_ready()
    try:
        key, _ = create_key(stack, "fuzzer")
        theirs, _ = create_key(stack, "victim")
        uploaded = httpx.post(f"{api.url}/v1/documents", headers={"Authorization": f"Bearer {theirs}"},
                              files={"file": ("p.png", tiny_page(1))}, timeout=30)
        assert uploaded.status_code == 202, uploaded.text
        body = uploaded.json()
        free = _schemathesis(api, key, tmp_path, CONFIG)
        assert free.returncode == 0, free.stdout[-12000:] + free.stderr[-3000:]
        pinned = tmp_path / "pinned.toml"  # the other tenant's ids in every path: each must answer 404
        pinned.write_text(CONFIG.read_text() + f'\n[parameters]\n"path.document_id" = "{body["document_id"]}"\n'
                          f'"path.page_id" = "{body["pages"][0]["page_id"]}"\n'
                          f'"path.ingest_id" = "{body["ingest_id"]}"\n')
        other = _schemathesis(api, key, tmp_path, pinned, "--phases", "examples,fuzzing")
        assert other.returncode == 0, other.stdout[-12000:] + other.stderr[-3000:]
        assert "5xx" not in api.output() and " 500 " not in api.output(), api.output()[-3000:]
    finally:
        api.stop()
