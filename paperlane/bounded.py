"""Processes that may die: a pool in which one task's crash, memory or time costs that task alone.

``concurrent.futures.ProcessPoolExecutor`` breaks as a whole when one of its processes dies: every
task in flight fails with it, and nothing says which task killed it. A hostile page (a PDF whose
render allocates gigabytes, or draws for minutes) must cost only itself. Here each process is
driven by a thread of its own in the parent, which sends it one task at a time and so always knows
which task it holds:

- a task that uses more than ``timeout`` seconds of CPU, or runs for more than ``WALL_FACTOR`` times that
  (waiting on something, or starved by the rest of the machine): its process is killed (SIGKILL) and
  replaced, and that task's future fails with ``TaskTimedOut``. The limit is the task's own CPU time,
  so an honest page on a loaded machine is not killed for the machine's load;
- a process that dies (a crash in C code; memory beyond its limit, which PDFium answers with an
  abort): it is replaced, and the task it held fails with ``ProcessDied`` (its exit status);
- every other task goes on, on the other processes, and on the replacement when it is up.

A process ignores SIGTERM and SIGINT: a stop signalled to the whole process group reaches the parent, which lets
the tasks running finish (``close``) and then stops its processes.

Each process runs ``initializer(*initargs)`` once, then is held to ``memory_bytes`` of address space
more than it had after that (``RLIMIT_AS``: what a page may allocate on top of the libraries already
loaded). Results and arguments are pickled through one pipe per process.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import os
import queue
import resource
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

_Task = tuple[Callable[..., Any], tuple[Any, ...], Future[Any]]

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_START_TIMEOUT = 120.0  # seconds a new process may take to import and initialise
WALL_FACTOR = 3.0  # a task's wall-clock limit, in multiples of its CPU limit


class TaskFailed(Exception):
    """The process running a task did not return its result (the root of the two below)."""


class TaskTimedOut(TaskFailed):
    """The task ran past the pool's CPU or wall-clock limit; its process was killed."""


class ProcessDied(TaskFailed):
    """The process died while it ran the task (``exitcode``: its exit status, -N for signal N)."""

    def __init__(self, message: str, exitcode: int | None) -> None:
        super().__init__(message)
        self.exitcode = exitcode


def _child(conn: Connection, memory_bytes: int, initializer: Callable[..., None] | None,
           initargs: tuple[Any, ...]) -> None:
    """A pool process: initialise, bound its address space, then run tasks until told to stop (None)."""
    # A crash (an abort where memory ran out) must not spend seconds writing a core of the process.
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # The pool stops its processes itself (``close``: the tasks running finish). A stop signalled to the whole
    # process group (systemd's default, a terminal's Ctrl-C, ``kill -- -PGID``) would otherwise kill a task in the
    # middle, and its work would be recorded as failed while the parent is still stopping gracefully.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if initializer is not None:
        initializer(*initargs)
    if memory_bytes:
        size = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (size + memory_bytes, size + memory_bytes))
    conn.send("ready")
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        fn, args = task
        try:
            conn.send((True, fn(*args)))
        except Exception as exc:  # noqa: BLE001 - a task's own error goes back to its future
            try:
                conn.send((False, exc))
            except Exception:  # an exception that does not pickle
                conn.send((False, RuntimeError(f"{type(exc).__name__}: {exc}")))


class BoundedPool:
    """``processes`` processes, each task under a memory and a time limit (see the module docstring).

    ``submit`` returns a ``Future``: its result, the task's exception, or ``TaskTimedOut``/``ProcessDied``.
    """

    def __init__(self, processes: int, *, name: str, memory_bytes: int, timeout: float,
                 initializer: Callable[..., None] | None = None, initargs: tuple[Any, ...] = ()) -> None:
        self._ctx = multiprocessing.get_context("spawn")
        self._name, self._memory, self._timeout = name, memory_bytes, timeout
        self._init, self._initargs = initializer, initargs
        # (0: first, 1: in turn, 2: stop; the order submitted; the task or None): tasks marked first go before
        # those waiting in turn, each kind in the order submitted.
        self._tasks: queue.PriorityQueue[tuple[int, int, _Task | None]] = queue.PriorityQueue()
        self._order = itertools.count()
        self._closed = False
        self.replaced = 0  # processes killed or found dead, and replaced
        self._count = threading.Lock()
        # Start every process now, side by side (spawning and importing takes a second or two each).
        started = [self._start() for _ in range(processes)]
        self._pids: dict[int, int | None] = {}  # slot -> its process's id
        self._threads = [threading.Thread(target=self._drive, args=(i, self._ready(proc)), name=f"{name}-{i}",
                                          daemon=True) for i, proc in enumerate(started)]
        for thread in self._threads:
            thread.start()

    def _start(self) -> tuple[BaseProcess, Connection]:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_child, args=(child, self._memory, self._init, self._initargs),
                                 name=self._name, daemon=True)
        proc.start()
        child.close()
        return proc, parent

    def _ready(self, started: tuple[BaseProcess, Connection]) -> tuple[BaseProcess, Connection]:
        proc, conn = started
        if not conn.poll(_START_TIMEOUT) or conn.recv() != "ready":
            raise RuntimeError(f"{self._name}: a new process did not start")
        return proc, conn

    def submit(self, fn: Callable[..., Any], *args: Any, first: bool = False) -> Future[Any]:
        """Run ``fn(*args)`` (a module-level function; arguments and result pickled) in a process of the pool;
        ``first``: before the tasks waiting that were not (work that finishes something before work that starts
        something)."""
        if self._closed:
            raise RuntimeError(f"{self._name} is closed")
        future: Future[Any] = Future()
        self._tasks.put((0 if first else 1, next(self._order), (fn, args, future)))
        return future

    @property
    def pids(self) -> list[int]:
        """The ids of the pool's processes now."""
        return [pid for pid in self._pids.values() if pid is not None]

    def _drive(self, slot: int, proc_conn: tuple[BaseProcess, Connection]) -> None:
        proc, conn = proc_conn
        self._pids[slot] = proc.pid
        while True:
            _, _, task = self._tasks.get()
            if task is None:
                _stop(proc, conn)
                self._pids.pop(slot, None)
                return
            fn, args, future = task
            if not future.set_running_or_notify_cancel():
                continue
            outcome = self._run(proc, conn, fn, args)
            if isinstance(outcome, TaskFailed):
                self._pids[slot] = None  # gone; its replacement's id once it is up
                future.set_exception(outcome)
                with self._count:
                    self.replaced += 1
                replaced = self._replace()
                if replaced is None:
                    self._pids.pop(slot, None)
                    return
                proc, conn = replaced
                self._pids[slot] = proc.pid
            elif outcome[0]:
                future.set_result(outcome[1])
            else:
                future.set_exception(outcome[1])

    def _replace(self) -> tuple[BaseProcess, Connection] | None:
        """A new process for a slot whose process is gone, tried until one starts (None: the pool closed)."""
        while not self._closed:
            try:
                return self._ready(self._start())
            except Exception as exc:  # noqa: BLE001 - the machine is short of something: try again
                log.error("%s: cannot start a process (%s); trying again", self._name, exc)
                time.sleep(1.0)
        return None

    def _run(self, proc: BaseProcess, conn: Connection, fn: Callable[..., Any],
             args: tuple[Any, ...]) -> tuple[bool, Any] | TaskFailed:
        """The task's (ok, result or exception), or the TaskFailed it ended in (its process then gone)."""
        t0, cpu0 = time.monotonic(), _cpu_seconds(proc)
        wall = self._timeout * WALL_FACTOR
        try:
            conn.send((fn, args))
            cpu, elapsed = 0.0, 0.0
            while True:
                # A single-threaded task uses at most as much CPU as time passes: wait out what it has left (its CPU
                # read from /proc only then, not before the first wait: most tasks answer within it).
                if conn.poll(max(0.05, min(self._timeout - cpu, wall - elapsed))):
                    answer: tuple[bool, Any] = conn.recv()
                    return answer
                cpu, elapsed = _cpu_seconds(proc) - cpu0, time.monotonic() - t0
                if cpu >= self._timeout or elapsed >= wall:
                    break
        except (EOFError, OSError):
            pass  # the process is gone
        except Exception as exc:  # noqa: BLE001 - a task whose arguments or result do not pickle: its own error
            return False, exc
        else:
            _kill(proc, conn)
            log.warning("%s: a task used %.1f s of CPU in %.1f s, past its limits (%g s of CPU, %g s): its process "
                        "killed", self._name, cpu, elapsed, self._timeout, wall)
            if cpu >= self._timeout:
                return TaskTimedOut(f"used more than {self._timeout:g} s of CPU")
            return TaskTimedOut(f"ran longer than {wall:g} s")
        _kill(proc, conn)
        code = proc.exitcode
        log.warning("%s: a process died running a task (%s)", self._name, _status(code))
        return ProcessDied(f"its process died ({_status(code)})", code)

    def close(self) -> None:
        """Cancel the tasks not started, let those running finish, and stop every process."""
        self._closed = True
        while True:
            try:
                _, _, task = self._tasks.get_nowait()
            except queue.Empty:
                break
            if task is not None:
                task[2].cancel()
        for _ in self._threads:
            self._tasks.put((2, next(self._order), None))
        for thread in self._threads:
            thread.join()


def _status(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"exit status {code}"


def process_cpu_seconds(pid: int) -> float:
    """CPU seconds (user and system) process ``pid`` has used, from ``/proc/<pid>/stat`` (OSError: it is gone)."""
    # Fields after the command name, which may hold spaces and parentheses: state, ppid, ...; utime and stime
    # are fields 14 and 15 of proc(5).
    fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def _cpu_seconds(proc: BaseProcess) -> float:
    """CPU seconds the process has used; 0 once it is gone."""
    try:
        return process_cpu_seconds(proc.pid) if proc.pid is not None else 0.0
    except OSError:
        return 0.0


def _stop(proc: BaseProcess, conn: Connection) -> None:
    try:
        conn.send(None)
    except OSError:
        pass
    proc.join(5)
    _kill(proc, conn)


def _kill(proc: BaseProcess, conn: Connection) -> None:
    if proc.is_alive():
        proc.kill()
    proc.join()
    conn.close()
