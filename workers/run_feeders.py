"""Several feeding processes for ``paperlane run``: ``RunFeeders``, the run's ``Feed`` when there is more than one.

Each feeding process is a ``Runtime`` of its own (engine client, adaptive window, micro-batcher, its share of the
CPU pool) with page slots on threads; it attempts the pages it is handed exactly as a one-process run does
(``embedded.attempt_page``: the same attempt runner, its page files written into the out folder) and reports each
back as a small ``Reported``. ONE lane scheduler, in the run's own process (``embedded._Scheduler``), hands a page
to a feeding process when it has a free slot, so interactive-before-batch and the batch share hold across them.
Job rows record ``run-feeder-N`` as their worker. The run's own process registers pages, keeps the retry clock and
has the document outputs written; it holds no engine.

How many (``run_feeder_count``): the rule of ``paperlane worker`` (``worker.feeders``, unset: one per 8 usable CPUs,
1 to 4) for an engine server (``vllm``), which every feeding process reaches over HTTP; one for an engine inside the
process (``vllm-inprocess``, ``transformers``: each process would load the model onto the GPU again) and for the
RapidOCR CPU engine (each would load its own RapidOCR, and the CPU is the limit there anyway).

A feeding process that dies: the pages it held are queued again (their attempt not counted; one it finished
before dying stays finished) and reported failed in this run, no further page is handed out, the others finish
what they hold, and the run ends with the reason (``RunSummary.stopped``): the next run does what is left, nothing
lost and nothing done twice.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
from functools import partial
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path

from paperlane import heap
from paperlane.errors import PaperlaneError, public_reason
from paperlane.retry import Action, RetryPolicy
from paperlane.settings import EngineKind, Settings
from paperlane.storage import jobs as jobstore
from paperlane.storage.db import Database
from paperlane.workers.attempts import AttemptRunner
from paperlane.workers.embedded import Handout, Reported, attempt_page
from paperlane.workers.feeders import feeder_count, feeder_settings
from paperlane.workers.pipeline import Runtime

log = logging.getLogger(__name__)

_STOP_WAIT = 120.0  # seconds a feeding process may take to finish what it holds and close, before it is killed
Setup = Callable[[str], None]  # what a feeding process runs first, given its name (the entry point's logging)


def run_feeder_count(settings: Settings, cpus: float | None = None) -> int:
    """How many feeding processes ``paperlane run`` starts for the engine ``settings`` name (the module docstring);
    a warning when ``worker.feeders`` asked for more than one and the engine keeps one."""
    kind = settings.engine.kind
    if kind is EngineKind.VLLM:
        return feeder_count(settings, cpus)
    asked = settings.worker.feeders or 1
    if asked > 1:
        why = ("each feeding process would load its own RapidOCR and the CPU is the limit anyway"
               if kind is EngineKind.RAPID else "it runs inside the feeding process: each would load the model again")
        log.warning("worker.feeders=%d: paperlane run keeps one feeding process for engine %s (%s)", asked,
                    kind.value, why)
    return 1


def feeder_name(index: int) -> str:
    """The worker a feeding process's job rows record (``index`` from 1)."""
    return f"run-feeder-{index}"


@dataclass(frozen=True)
class _Ready:
    slots: int  # pages the feeding process works on at once
    pid: int


@dataclass(frozen=True)
class _CannotStart:
    reason: str  # why its runtime did not start (the engine unreachable, ...): one readable line


@dataclass
class _Feeder:
    name: str
    proc: BaseProcess
    inbox: Connection  # handouts to it (None: finish what you hold and stop)
    outbox: Connection  # what it reports
    slots: int = 0  # 0 until it is ready
    held: dict[str, Handout] = field(default_factory=dict)  # job id -> page handed to it and not reported yet
    dead: bool = False


class RunFeeders:
    """The run's ``Feed`` over ``count`` feeding processes (the module docstring). ``start`` them, ``close`` when
    the run is over."""

    def __init__(self, feeders: list[_Feeder], db: Database) -> None:
        self.feeders, self.db = feeders, db
        self._broken: str | None = None

    @classmethod
    def start(cls, settings: Settings, count: int, out_dir: Path, db: Database, *, setup: Setup) -> RunFeeders:
        """Start ``count`` feeding processes (spawned: a fresh interpreter each), each with its share of the CPUs;
        ``db``: the run's own, where a dead feeding process's pages are queued again."""
        ctx = multiprocessing.get_context("spawn")
        feeders = []
        for index in range(1, count + 1):
            inbox_r, inbox_w = ctx.Pipe(duplex=False)
            outbox_r, outbox_w = ctx.Pipe(duplex=False)
            own = feeder_settings(settings, index - 1, count)
            own = own.model_copy(update={"worker": own.worker.model_copy(update={"output_processes": 0})})
            name = feeder_name(index)
            proc = ctx.Process(target=_feed, args=(own, name, out_dir, inbox_r, outbox_w, setup), name=name)
            proc.start()
            inbox_r.close()
            outbox_w.close()
            feeders.append(_Feeder(name, proc, inbox_w, outbox_r))
        log.info("%d feeding processes share the engine", count)
        return cls(feeders, db)

    @property
    def slots(self) -> int:
        return sum(f.slots for f in self.feeders if not f.dead)

    @property
    def broken(self) -> str | None:
        return self._broken

    def free(self) -> bool:
        """Room for a page, once every live feeding process is ready: the first one ready would otherwise take
        every page its slots hold (hundreds) and leave the others none."""
        live = [f for f in self.feeders if not f.dead]
        return self._broken is None and all(f.slots > 0 for f in live) and any(self._room(f) > 0 for f in live)

    def hand(self, handout: Handout) -> None:
        feeder = max(self.feeders, key=self._room)  # the emptiest: pages spread evenly over the processes
        feeder.held[handout.page.job_id] = handout
        try:
            feeder.inbox.send(handout)
        except OSError:  # it died since the last reports (a broken pipe): the next says so, this page with its others
            log.debug("%s is gone: job %s goes back with the pages it held", feeder.name, handout.page.job_id)

    def reports(self, timeout: float | None) -> list[tuple[Handout, Reported]]:
        live = [f for f in self.feeders if not f.dead]
        ready = wait([*(f.outbox for f in live), *(f.proc.sentinel for f in live)], timeout)
        got: list[tuple[Handout, Reported]] = []
        for feeder in live:
            if feeder.outbox in ready:
                got += self._drain(feeder)
        for feeder in live:
            if feeder.proc.sentinel in ready and not feeder.dead:
                got += self._died(feeder)
        return got

    def close(self) -> None:
        """Stop every feeding process (each finishes what it holds, then closes its engine and pools)."""
        for feeder in self.feeders:
            if not feeder.dead:
                try:
                    feeder.inbox.send(None)
                except OSError:
                    pass
        for feeder in self.feeders:
            feeder.proc.join(_STOP_WAIT)
            if feeder.proc.is_alive():
                log.warning("%s did not stop in %.0fs: killed", feeder.name, _STOP_WAIT)
                feeder.proc.kill()
                feeder.proc.join()

    def _room(self, feeder: _Feeder) -> int:
        return 0 if feeder.dead else feeder.slots - len(feeder.held)

    def _drain(self, feeder: _Feeder) -> list[tuple[Handout, Reported]]:
        got = []
        try:
            while feeder.outbox.poll():
                msg = feeder.outbox.recv()
                if isinstance(msg, _Ready):
                    feeder.slots = msg.slots
                    log.info("%s (pid %d) ready: %d page slots", feeder.name, msg.pid, msg.slots)
                elif isinstance(msg, _CannotStart):
                    self._broken = self._broken or f"feeding process {feeder.name} could not start: {msg.reason}"
                else:
                    got.append((feeder.held.pop(msg.job_id), msg))
        except (EOFError, OSError):  # it is gone: its sentinel says so too
            pass
        return got

    def _died(self, feeder: _Feeder) -> list[tuple[Handout, Reported]]:
        """Its pages queued again for the next run, reported lost here; no page handed out after this."""
        got = self._drain(feeder)  # what it reported before it went
        feeder.proc.join()
        feeder.dead = True
        code = feeder.proc.exitcode
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit status {code}"
        held = list(feeder.held.values())
        feeder.held.clear()
        reason = (f"feeding process {feeder.name} (pid {feeder.proc.pid}) died ({how}) holding {len(held)} pages: "
                  f"the run stopped; run it again to finish (those pages are queued)")
        log.error("%s", reason)
        self._broken = self._broken or reason
        for handout in held:
            jobstore.hand_back(self.db, handout.page.job_id)  # one it finished stays finished
        lost = f"its feeding process died ({how}); queued for the next run"
        return got + [(h, Reported(h.page.job_id, Action.HANDED_BACK, error=lost, lost=True)) for h in held]


def _feed(settings: Settings, name: str, out_dir: Path, inbox: Connection, outbox: Connection, setup: Setup) -> None:
    """A feeding process: attempt each handed page on a slot, report it; ``None`` (or the run gone): finish what it
    holds and stop."""
    setup(name)
    try:
        rt = Runtime.start(settings)
    except PaperlaneError as exc:
        log.error("%s could not start: %s", name, exc)
        outbox.send(_CannotStart(public_reason(exc)))
        return
    runner = AttemptRunner(rt, RetryPolicy.of(settings.worker), worker=name, crash_limit=False)
    heap.after_start()
    lock = threading.Lock()  # slots report from their threads

    def report(handout: Handout, fut: Future[Reported]) -> None:
        try:
            reported = fut.result()
        except Exception:  # nothing recorded (the database unreachable): the run reads the row and says
            log.exception("job %s: its attempt raised", handout.page.job_id)
            reported = Reported(handout.page.job_id, None)
        with lock:
            outbox.send(reported)

    try:
        with ThreadPoolExecutor(max_workers=rt.slots, thread_name_prefix="slot") as slots:
            outbox.send(_Ready(rt.slots, os.getpid()))
            while True:
                try:
                    handout = inbox.recv()
                except EOFError:  # the run is gone
                    break
                if handout is None:
                    break
                slots.submit(attempt_page, runner, out_dir, handout).add_done_callback(partial(report, handout))
    finally:
        rt.close()
