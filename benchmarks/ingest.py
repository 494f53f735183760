"""Bulk ingest speed and memory: ``paperlane submit`` into real Redis, PostgreSQL and SeaweedFS S3.

Part 1 (speed): a folder of --pages small receipt-sized JPEGs (distinct bytes each) is submitted by a
real ``paperlane submit`` process; the clock runs from its start to its exit (imports, migrations
check and connecting included). Every page must end registered as a job with a published message:
the benchmark counts the rows and the Redis messages afterwards.

Part 2 (memory, --tar-mb N): a tar of N MB made of A4-sized members (random bytes behind a JPEG
header: the producer stores originals, it does not decode them) is submitted the same way, and the
peak RSS of the submit process is printed beside the archive's size.

Last lines: ``ingest_pages_per_s=`` (target >= 1000) and, with --tar-mb, ``ingest_tar_peak_rss_mb=``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

import redis as redis_lib
from common import PAPERLANE, small_page, start_services, with_comment, write_config
from sqlalchemy import func, select

from paperlane.priority.lanes import Lane
from paperlane.settings import load_settings
from paperlane.storage.db import Database
from paperlane.storage.tables import JobRow, PageRow


def _folder(root: Path, pages: int) -> Path:
    folder = root / "pages"
    folder.mkdir()
    base = small_page(0)
    for i in range(pages):
        sub = folder / f"{i // 1000:03d}"
        sub.mkdir(exist_ok=True)
        (sub / f"r{i:06d}.jpg").write_bytes(with_comment(base, i))
    return folder


def _tar(root: Path, mb: int) -> Path:
    path = root / "big.tar"
    member = 8 << 20
    with tarfile.open(path, "w") as tar:
        for i in range(max(1, (mb << 20) // member)):
            data = b"\xff\xd8\xff\xe0" + os.urandom(member - 6) + b"\xff\xd9"
            info = tarfile.TarInfo(f"scans/s{i:05d}.jpg")
            info.size = len(data)
            tar.addfile(info, fileobj=_Bytes(data))
    return path


class _Bytes:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def read(self, n: int = -1) -> bytes:
        end = len(self.data) if n < 0 else self.pos + n
        out, self.pos = self.data[self.pos:end], min(end, len(self.data))
        return out


# Runs the command and prints its peak RSS (kB) last on stderr: a process of its own, so that the
# figure is that command's and not the largest of every child this benchmark started.
_PEAK = ("import resource, subprocess, sys; rc = subprocess.run(sys.argv[1:]).returncode; "
         "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); sys.exit(rc)")


def _submit(config: Path, path: Path) -> tuple[float, int, str]:
    """Seconds, peak RSS in kB, stderr of one ``paperlane submit`` process."""
    t0 = time.perf_counter()
    proc = subprocess.run([PAPERLANE[0], "-c", _PEAK, *PAPERLANE, "--config", str(config), "submit", str(path)],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"submit failed:\n{proc.stderr[-3000:]}")
    said, _, peak = proc.stderr.strip().rpartition("\n")
    return seconds, int(peak), said


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", type=int, default=10_000)
    ap.add_argument("--tar-mb", type=int, default=0, help="also submit a tar of this many MB and report peak RSS")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        svc = start_services(root)
        try:
            config = write_config(svc, root)
            settings = load_settings(config)
            folder = _folder(root, args.pages)
            seconds, rss_kb, said = _submit(config, folder)
            db = Database(settings.database_url)
            with db.session() as s:
                jobs = s.scalar(select(func.count()).select_from(JobRow).where(JobRow.enqueued_at.is_not(None)))
                pages = s.scalar(select(func.count()).select_from(PageRow))
            r = redis_lib.Redis.from_url(settings.redis.url)
            messages = sum(r.llen(k) for k in r.scan_iter(f"{Lane.BATCH.queue}*"))
            print(said.splitlines()[-1])
            print(f"{args.pages} pages in {seconds:.1f}s: {pages} pages and {jobs} published jobs in PostgreSQL, "
                  f"{messages} messages in Redis; peak RSS {rss_kb / 1024:.0f} MB")
            if not (pages == jobs == messages == args.pages):
                raise SystemExit("not every page was registered and published")
            if args.tar_mb:
                tar = _tar(root, args.tar_mb)
                t_seconds, t_rss, t_said = _submit(config, tar)
                print(t_said.splitlines()[-1])
                print(f"tar of {tar.stat().st_size >> 20} MB in {t_seconds:.1f}s, peak RSS {t_rss / 1024:.0f} MB")
            print(f"ingest_pages_per_s={args.pages / seconds:.0f}")
            if args.tar_mb:
                print(f"ingest_tar_peak_rss_mb={t_rss / 1024:.0f}")
        finally:
            svc.stop()


if __name__ == "__main__":
    main()
