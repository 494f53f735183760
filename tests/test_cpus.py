"""The preprocessing pool's size: the CPUs this process may use (affinity, cgroup quota) less the worker's own."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from paperlane.settings import Settings, WorkerSettings
from paperlane.workers.cpus import WORKER_OWN_CPUS, available_cpus, cgroup_cpu_quota, pool_processes


def cgroup_tree(root: Path, files: dict[str, str]) -> Path:
    """A cgroup file system under ``root``: {relative path: contents}."""
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_cgroup_v2_quota_is_read_from_cpu_max_and_the_smallest_of_the_ancestors_counts(tmp_path: Path) -> None:
    root = cgroup_tree(tmp_path, {
        "cpu.max": "max 100000\n",
        "kubepods/cpu.max": "600000 100000\n",  # 6 CPUs for the pods
        "kubepods/pod1/cpu.max": "250000 100000\n",  # 2.5 for this one
        "kubepods/pod1/worker/cpu.max": "max 100000\n",
    })
    assert cgroup_cpu_quota("0::/kubepods/pod1/worker\n", root) == 2.5
    assert cgroup_cpu_quota("0::/kubepods\n", root) == 6.0
    assert cgroup_cpu_quota("0::/\n", root) is None  # "max": no quota


def test_inside_a_container_the_cgroup_root_is_the_containers_own(tmp_path: Path) -> None:
    # /proc/self/cgroup names the host's path; only the container's cgroup is mounted, at the root.
    root = cgroup_tree(tmp_path, {"cpu.max": "400000 100000\n"})
    assert cgroup_cpu_quota("0::/system.slice/docker-abc.scope\n", root) == 4.0


def test_cgroup_v1_cfs_quota_is_read_and_minus_one_means_none(tmp_path: Path) -> None:
    root = cgroup_tree(tmp_path, {
        "cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n",
        "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "150000\n", "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
        "memory/docker/abc/memory.limit_in_bytes": "1073741824\n",
    })
    membership = "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n"
    assert cgroup_cpu_quota(membership, root) == 1.5
    assert cgroup_cpu_quota("4:cpu,cpuacct:/\n", root) is None


def test_unreadable_or_odd_files_mean_no_quota(tmp_path: Path) -> None:
    root = cgroup_tree(tmp_path, {"cpu.max": "garbage\n", "a/cpu.max": "0 100000\n"})
    assert cgroup_cpu_quota("0::/a\n", root) is None
    assert cgroup_cpu_quota("", root) is None


def test_the_cpus_usable_are_the_affinity_or_the_quota_whichever_is_fewer(tmp_path: Path) -> None:
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text("0::/\n")
    root = cgroup_tree(tmp_path / "cg", {"cpu.max": "350000 100000\n"})
    assert available_cpus(affinity=16, proc_cgroup=proc, cgroup_root=root) == 3.5
    assert available_cpus(affinity=2, proc_cgroup=proc, cgroup_root=root) == 2.0
    assert available_cpus(affinity=8, proc_cgroup=tmp_path / "absent", cgroup_root=root) == 8.0


@pytest.mark.parametrize(("cpus", "processes"), [(16, 15), (3.5, 2), (2, 1), (1, 1), (0.5, 1)])
def test_the_pool_gets_the_usable_cpus_less_the_workers_own(cpus: float, processes: int) -> None:
    assert WORKER_OWN_CPUS == 1
    assert pool_processes(None, cpus) == processes


def test_the_setting_overrides_and_zero_keeps_meaning_in_process() -> None:
    assert pool_processes(4, 16) == 4
    assert pool_processes(0, 16) == 0
    assert Settings().worker.preprocess_processes is None  # the default is the machine's size


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="Linux only")
def test_this_process_is_measured_from_its_own_affinity() -> None:
    assert 0 < available_cpus() <= len(os.sched_getaffinity(0))
    assert pool_processes(WorkerSettings().preprocess_processes) == max(1, int(available_cpus()) - 1)
