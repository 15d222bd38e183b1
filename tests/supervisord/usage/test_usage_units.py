"""The pure parts of usage and limits: sizes, nvidia-smi output, the
scheduler's memory/CPU admission and reservation messages, and the process
scanner against real processes (setsid children, pid identity)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

import pytest

from supervisord.daemon.scheduler.policy import Active, Gpu, Situation, Waiting, decide
from supervisord.daemon.usage.nvidia import parse_apps, parse_gpus
from supervisord.daemon.usage.procs import ProcessScanner, TreeSpec
from supervisord.shared.exceptions import TaskError
from supervisord.shared.limits import format_bytes, parse_cpus, parse_memory

G = [Gpu(i, f"GPU-{i}") for i in range(4)]
NOW = 1_000_000.0


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("16G", 16 << 30),
        ("512m", 512 << 20),
        ("1.5GiB", 3 << 29),
        ("2048K", 2 << 20),
        ("1GB", 1 << 30),
        (1 << 20, 1 << 20),
    ],
)
def test_memory_sizes(text: object, size: int) -> None:
    assert parse_memory(text) == size


@pytest.mark.parametrize("bad", ["0", "10XB", "16", "G", "-1G", "1.5.2G", True, "16 G B"])
def test_bad_memory_sizes_name_the_flag(bad: object) -> None:
    with pytest.raises(TaskError, match="^--memory: "):
        parse_memory(bad)


def test_cpus_and_formatting() -> None:
    assert parse_cpus("0.5") == 0.5 and parse_cpus(2) == 2.0
    for bad in ("0", "-1", "x", "inf", True):
        with pytest.raises(TaskError, match="^--cpus: "):
            parse_cpus(bad)
    assert (format_bytes(None), format_bytes(900), format_bytes(3 << 29), format_bytes(16 << 30)) == (
        "-",
        "900B",
        "1.5G",
        "16G",
    )


def test_nvidia_output_that_does_not_parse_is_skipped_and_counted() -> None:
    apps, skipped = parse_apps(
        "GPU-a, 123, 1024\nGPU-b, [N/A], 5\nNo running processes found\n,,\ngarbage\nGPU-a, 7, [N/A]\n"
    )
    assert [(a.gpu_uuid, a.pid, a.memory_bytes) for a in apps] == [("GPU-a", 123, 1 << 30), ("GPU-a", 7, 0)]
    assert skipped == 3
    gpus, skipped = parse_gpus("0, GPU-a, 37, 2048\n1, GPU-b, [Not Supported], [N/A]\nx, y\n")
    assert [(g.index, g.utilization, g.memory_used_bytes) for g in gpus] == [(0, 37, 2048 << 20), (1, None, None)]
    assert skipped == 1


def _s(waiting: list[Waiting], active: list[Active] | None = None, **kw: object) -> Situation:
    return Situation(waiting, active or [], G, {}, {}, NOW, **kw)  # type: ignore[arg-type]


def test_memory_and_cpus_are_claimed_at_admission() -> None:
    d = decide(
        _s(
            [
                Waiting("a", 1, memory_bytes=10 << 30),
                Waiting("b", 2, memory_bytes=8 << 30),
                Waiting("c", 3, cpus=3),
                Waiting("d", 4, cpus=1),
                Waiting("e", 5),
            ],
            [Active("x", "default", (), NOW + 99, memory_bytes=4 << 30, cpus=1)],
            memory=16 << 30,
            cpus=4.0,
        )
    )
    assert [a.run_id for a in d.admit] == ["a", "c", "e"]
    assert d.pending["b"].reason == "WaitingForMemory"
    assert d.pending["b"].message == "needs 8G of memory, 2G of 16G unclaimed (scheduler.memory)"
    assert d.pending["d"].reason == "WaitingForCPUs"
    assert d.pending["d"].message == "needs 1 CPUs, 0 of 4 unclaimed (scheduler.cpus)"


def test_a_reservation_is_explained_and_a_held_dependency_says_so() -> None:
    active = [Active(f"h{i}", "default", (f"GPU-{i}",), NOW + 3600 * (i + 1)) for i in range(3)]
    d = decide(
        _s(
            [
                Waiting("big", 1, gpus=4),
                Waiting("long", 2, gpus=1, timeout_s=99999),
                Waiting("held", 3, held=True),
                Waiting("dep", 4, after=("held",)),
            ],
            active,
        )
    )
    res = d.reservation
    assert res is not None and res.run_id == "big" and res.gpus == (0, 1, 2, 3) and res.free == 1
    assert res.shadow == NOW + 3 * 3600
    text = res.describe()
    assert text.startswith("GPUs 0-3 reserved for run big (needs 4) from about ")
    assert text.endswith("; a run with --timeout under 2h59m could start now")
    assert d.pending["long"].message.startswith("needs 1 GPU; GPUs 0-3 reserved for run big (needs 4) from about ")
    assert "only a run that ends before then may start on the free ones" in d.pending["long"].message
    assert d.pending["dep"].message == "waits for run held (QUEUED, held)"
    # a short run backfills onto the free GPU
    d = decide(_s([Waiting("big", 1, gpus=4), Waiting("short", 2, gpus=1, timeout_s=600)], active))
    assert [a.run_id for a in d.admit] == ["short"]


def test_scanner_counts_setsid_children_and_the_reaped_and_never_a_reused_pid() -> None:
    scanner = ProcessScanner()
    marker = f"{os.getpid():012x}"[-12:]
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid(); b = bytearray(20 << 20); b[::4096] = b'x' * len(b[::4096]); time.sleep(30)\n"
        "else:\n"
        "    sum(i for i in range(3_000_000)); time.sleep(30)\n"
    )
    env = {**os.environ, "JOBSUP_RUN_ID": marker}
    parent = subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        tree = scanner.scan([TreeSpec(marker, None, None)])[marker]
        while len(tree.procs) < 2 or tree.rss_bytes < 20 << 20:
            assert time.monotonic() < deadline, tree
            time.sleep(0.1)
            tree = scanner.scan([TreeSpec(marker, None, None)])[marker]
        assert parent.pid in tree.pids and tree.cpu_s > 0
        # a runner whose recorded start time does not match is not the run's runner
        other = scanner.scan([TreeSpec("nobody000000", os.getpid(), 1)])["nobody000000"]
        assert other.runner is None and not other.procs
    finally:
        for pid in tree.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        parent.wait()
    assert parent.pid not in scanner.scan([TreeSpec(marker, None, None)])[marker].pids


def test_triage_of_a_local_run_over_its_memory_says_what_to_do() -> None:
    from supervisord.client.mcp.server import triage_suggestion

    local = triage_suggestion({"phase": "ERROR", "reason": "OOMKilled", "backend": "local"})
    assert "--memory" in local and "k8s.yaml" not in local
    assert "k8s.yaml" in triage_suggestion({"phase": "ERROR", "reason": "OOMKilled", "backend": "kubernetes"})
    assert "--memory" in triage_suggestion({"phase": "QUEUED", "reason": "WaitingForMemory"})
