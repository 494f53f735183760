"""How many CPUs this process may use, and so how many processes preprocess pages beside the worker.

``os.cpu_count()`` is the machine's core count: in a container limited to 4 CPUs on a 64-core host it
says 64, and a pool of 63 processes would thrash under the quota. What a process may use is the
smaller of its CPU affinity (``taskset``, Kubernetes' static CPU manager, ``docker --cpuset-cpus``)
and its cgroup's CPU quota (``docker --cpus``, Kubernetes CPU limits): ``cpu.max`` on cgroup v2,
``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` on v1, this cgroup's and every ancestor's, the smallest
counting. Both are read from files; nothing here depends on a library or on being in a container.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

# The worker process itself: one core's worth. It feeds the engine: the page slots (Celery's threads, each page's
# rows), the engine client (its requests, and every streamed answer read through the loop guard) and the pool's
# hand-offs; the pool does the rest (preparing, base64 for a server engine, post-processing, storing objects,
# document outputs). As one Python process it works on about one core at most, and the pool's processes are niced
# below it so that it gets that core when it needs it.
WORKER_OWN_CPUS = 1


def pool_processes(setting: int | None, cpus: float | None = None) -> int:
    """Processes for the preprocessing pool: ``setting`` when set (0: preprocess in-process), else the
    CPUs this process may use (``available_cpus``) less the worker's own (``WORKER_OWN_CPUS``), at least 1."""
    if setting is not None:
        return setting
    usable = available_cpus() if cpus is None else cpus
    return max(1, math.floor(usable) - WORKER_OWN_CPUS)


def available_cpus(*, affinity: int | None = None, proc_cgroup: Path = Path("/proc/self/cgroup"),
                   cgroup_root: Path = Path("/sys/fs/cgroup")) -> float:
    """The CPUs this process may use: those of its affinity (``affinity``: their count, default this
    process's), or fewer when a cgroup CPU quota allows less (a fraction when it allows one)."""
    cpus = float(affinity if affinity is not None else _affinity())
    try:
        membership = proc_cgroup.read_text()
    except OSError:  # not Linux, or /proc not mounted
        return cpus
    quota = cgroup_cpu_quota(membership, cgroup_root)
    return cpus if quota is None else min(cpus, quota)


def _affinity() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def cgroup_cpu_quota(membership: str, root: Path) -> float | None:
    """The CPU quota (in CPUs) of the cgroups named in ``membership`` (the text of ``/proc/self/cgroup``)
    and their ancestors, under the cgroup file system mounted at ``root``; None when none sets one."""
    quotas = []
    for line in membership.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":  # cgroup v2: one hierarchy at root
            quotas += [_v2_quota(d) for d in _up(root, path)]
        elif "cpu" in controllers.split(","):  # cgroup v1: the cpu controller's own hierarchy
            mount = next((root / name for name in (controllers, "cpu,cpuacct", "cpuacct,cpu", "cpu")
                          if (root / name).is_dir()), None)
            if mount is not None:
                quotas += [_v1_quota(d) for d in _up(mount, path)]
    found = [q for q in quotas if q is not None]
    return min(found) if found else None


def _up(mount: Path, path: str) -> list[Path]:
    """The cgroup's folder under ``mount`` and each of its ancestors' up to ``mount``, those that exist
    (inside a container the cgroup's own path is often not mounted: its root is the container's cgroup)."""
    parts = [p for p in path.strip().split("/") if p]
    folders = [mount.joinpath(*parts[:n]) for n in range(len(parts), -1, -1)]
    return [f for f in folders if f.is_dir()]


def _v2_quota(folder: Path) -> float | None:
    """cgroup v2 ``cpu.max``: "<quota> <period>" in microseconds, or "max <period>" for none."""
    try:
        quota, period = (folder / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else _ratio(int(quota), int(period))
    except (OSError, ValueError):
        return None


def _v1_quota(folder: Path) -> float | None:
    """cgroup v1 ``cpu.cfs_quota_us`` (-1: none) over ``cpu.cfs_period_us``."""
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
        return _ratio(quota, period)
    except (OSError, ValueError):
        return None


def _ratio(quota: int, period: int) -> float | None:
    return quota / period if quota > 0 and period > 0 else None

