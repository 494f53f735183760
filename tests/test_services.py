"""The test services' own harness (tests/services.py): a server that ends before it serves is told at once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests import services

pytestmark = pytest.mark.processes  # starts a process of its own


def test_a_server_that_exits_before_it_serves_is_reported_with_its_log(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    proc = subprocess.Popen([sys.executable, "-c", "print('bind: address already in use'); raise SystemExit(3)"],
                            stdout=log.open("wb"), stderr=subprocess.STDOUT)

    # Not the timeout's ServiceError: the process's end, with what it said.
    with pytest.raises(services.ServiceExited, match="(?s)exited with 3 .*address already in use"):
        services._wait(lambda: False, "server", timeout=60, proc=proc, log=log)
