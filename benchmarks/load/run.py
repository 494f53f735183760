"""Start a whole stack (private Redis, PostgreSQL and SeaweedFS S3, a ``paperlane api`` at its shipped defaults,
a ``paperlane worker`` in front of the simulated vLLM server of tests/sim_engine.py), make ``--tenants`` tenants'
keys, and run ``locustfile.py`` against it headless for ``--seconds``; prints locust's totals and, last,
``requests_per_s=<n> p99_ms=<n> failures=<n>``.

    .venv/bin/python benchmarks/load/run.py --users 30 --seconds 60
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from common import start_services, start_sim, start_worker, stop, write_config  # noqa: E402

from paperlane.settings import load_settings  # noqa: E402
from paperlane.storage import tenants  # noqa: E402
from paperlane.storage.db import Database  # noqa: E402
from tests.api_server import ApiProcess  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--users", type=int, default=30)
    p.add_argument("--tenants", type=int, default=3)
    p.add_argument("--seconds", type=int, default=60)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        svc = start_services(root)
        sim = start_sim(root)
        worker = server = None
        try:
            config = write_config(svc, root)
            db = Database(load_settings(config).database_url)
            db.upgrade()
            keys = [tenants.create_key(db, tenant=f"load{i}").key for i in range(args.tenants)]
            worker = start_worker(config, root / "worker.log", sim.url)
            server = ApiProcess(config, root / "api.log").wait_ready()
            subprocess.run([sys.executable, "-m", "locust", "-f", str(HERE / "locustfile.py"), "--headless",
                            "--host", server.url, "-u", str(args.users), "-r", str(max(1, args.users // 3)),
                            "-t", f"{args.seconds}s", "--csv", str(root / "load"), "--only-summary"],
                           env={**os.environ, "PAPERLANE_LOAD_KEYS": ",".join(keys)}, check=False, timeout=args.seconds
                           + 120)
            with (root / "load_stats.csv").open() as fh:
                total = next(r for r in csv.DictReader(fh) if r["Name"] == "Aggregated")
        finally:
            if server is not None:
                server.stop()
            if worker is not None:
                stop(worker)
            sim.stop()
            svc.stop()
    print(f"requests_per_s={float(total['Requests/s']):.1f} p99_ms={total['99%']} "
          f"failures={total['Failure Count']} requests={total['Request Count']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
