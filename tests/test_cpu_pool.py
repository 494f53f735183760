"""The CPU pool's processes: what they cost per page beyond the preprocessing itself."""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

import pytest

from paperlane.errors import InputError
from paperlane.settings import Settings, WorkerSettings
from paperlane.storage.objects import open_store
from paperlane.workers.cpu_pool import CpuPool
from tests.pages import sample_lines
from tests.test_preprocess import VLM_SPEC, a4_grey_jpeg, pdf_pages


def _pool_processes() -> set[int]:
    """This process's children that are multiprocessing workers (not its resource tracker or services)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == os.getpid() and b"spawn_main" in (entry / "cmdline").read_bytes():
                found.add(int(entry.name))
        except (OSError, IndexError, ValueError):  # gone meanwhile
            continue
    return found


def _nice(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


def _minor_faults(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])


@pytest.mark.processes
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_pool_process_reuses_its_page_buffers(tmp_path: Path) -> None:
    # Without it, every A4 page faulted its buffers in again: ~1,400 page faults, 3.5 ms of CPU.
    settings = Settings(data_dir=tmp_path / "data", worker=WorkerSettings(preprocess_processes=1))
    store = open_store(settings)
    keys = [f"originals/{i}.jpg" for i in range(3)]
    for i, key in enumerate(keys):
        store.put(key, a4_grey_jpeg(sample_lines(i)))
    before = _pool_processes()
    pool = CpuPool(settings, store=store)
    try:
        # The pool's one process (niced), not those preparing interactive pages.
        [child] = {pid for pid in _pool_processes() - before if _nice(pid) == 5}
        for key in keys:  # warm: the first pages size the heap
            assert pool.submit(key, VLM_SPEC).result().page is not None
        faults = _minor_faults(child)
        for _ in range(3):
            for key in keys:
                assert pool.submit(key, VLM_SPEC).result().page is not None
        assert (_minor_faults(child) - faults) / (3 * len(keys)) < 100
    finally:
        pool.close()


@pytest.mark.processes
def test_a_pool_process_leaves_what_start_up_made_out_of_the_garbage_collectors_walks(tmp_path: Path) -> None:
    # gc.freeze() once started (paperlane.heap): the oldest generation's collections no longer walk every object of
    # pydantic, OpenCV, boto3... (40-100 ms each before).
    settings = Settings(data_dir=tmp_path / "data", worker=WorkerSettings(preprocess_processes=1))
    pool = CpuPool(settings, store=open_store(settings))
    try:
        assert pool._pool is not None  # the pool's own processes, as a page reaches them
        assert pool._pool.submit(gc.get_freeze_count).result() > 20_000  # a bare interpreter: ~8,000
    finally:
        pool.close()


@pytest.mark.processes
def test_the_page_number_reaches_a_pool_process_and_the_urgent_lane(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", worker=WorkerSettings(preprocess_processes=1))
    store = open_store(settings)
    store.put("originals/doc.pdf", pdf_pages((595, 842), (842, 595)))  # page 2 is landscape
    pool = CpuPool(settings, store=store)
    try:
        for urgent in (False, True):
            page = pool.submit("originals/doc.pdf", VLM_SPEC, page=2, urgent=urgent).result().page
            assert page is not None and (page.width, page.height) == (3508, 2479)
        missing = pool.submit("originals/doc.pdf", VLM_SPEC, page=3).result()
        assert missing.page is None and isinstance(missing.error, InputError)
        assert str(missing.error) == "no page 3 in this PDF (2 pages)"
    finally:
        pool.close()


@pytest.mark.processes
def test_a_preview_cut_on_a_pool_process_waits_in_a_file_not_in_the_pipes(tmp_path: Path) -> None:
    # The preview (700 kB an A4 page) went to the feeding process and back through the pipes: 2.3 ms of CPU a page.
    # Now the page carries a file name; the pixels are those cut in the process.
    import numpy as np

    from paperlane.workers.preprocess import prepare_page
    from paperlane.workers.previews import SpooledPreview

    settings = Settings(data_dir=tmp_path / "data", worker=WorkerSettings(preprocess_processes=1))
    store = open_store(settings)
    original = a4_grey_jpeg(sample_lines(1))
    store.put("originals/a.jpg", original)
    pool = CpuPool(settings, store=store)
    try:
        urgent = pool.submit("originals/a.jpg", VLM_SPEC, urgent=True).result().page
        page = pool.submit("originals/a.jpg", VLM_SPEC).result().page
        assert page is not None and urgent is not None
        spooled = page.preview
        assert isinstance(spooled, SpooledPreview) and isinstance(urgent.preview, SpooledPreview)
        here = prepare_page(original, VLM_SPEC, preview_side=settings.worker.annotated_max_side).preview
        assert isinstance(here, np.ndarray) and np.array_equal(spooled.load(), here)
        folder = Path(spooled.path).parent
        assert sorted(folder.glob("*.raw")) == sorted(Path(p.path) for p in (spooled, urgent.preview))
        spooled.discard()
        with pytest.raises(OSError):
            spooled.load()
    finally:
        pool.close()
    assert not folder.exists()  # the pool's folder goes with it


_MAKERS = {  # how a worker makes its folders (kept open in ``made``): the pool's previews, its spool's PDF copies
    "previews": ("from paperlane.workers.previews import FOLDER_PREFIX; from paperlane.workers.scratch import "
                 "ScratchFolder; made = ScratchFolder(FOLDER_PREFIX); folder = made.path"),
    "pdfs": ("from pathlib import Path; from paperlane.storage.localfs import LocalStore; from "
             "paperlane.workers.doccache import Spool; made = Spool(LocalStore(Path('objects')), budget=1, "
             "max_bytes=1); folder = made._folder"),
}


@pytest.mark.processes
@pytest.mark.parametrize("kind", sorted(_MAKERS))
def test_a_killed_workers_folder_goes_when_the_next_is_made_and_a_live_ones_stays(tmp_path: Path, kind: str) -> None:
    import subprocess

    # A process that makes its folder (and holds its lock) is killed: its folder stays, until the next is made.
    code = _MAKERS[kind] + "; import time; print(folder, flush=True); time.sleep(60)"
    run = {"env": {**os.environ, "TMPDIR": str(tmp_path)}, "cwd": tmp_path}
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, **run)
    assert proc.stdout is not None
    dead = Path(proc.stdout.readline().strip())
    proc.kill()
    proc.wait()
    assert dead.is_dir() and dead.parent == tmp_path
    # The next one made removes it; a live one (here: held by a process still running) stays.
    live = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, **run)
    try:
        assert live.stdout is not None
        held = Path(live.stdout.readline().strip())
        assert not dead.exists() and held.is_dir()
        after = subprocess.run([sys.executable, "-c", _MAKERS[kind] + "; print(folder)"], capture_output=True,
                               text=True, check=True, **run)
        assert held.is_dir() and Path(after.stdout.strip()) != held
    finally:
        live.kill()
        live.wait()
