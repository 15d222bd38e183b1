"""GPU memory and utilisation of local runs from a fake ``nvidia-smi`` on
PATH (the real daemon and CLI): matched to the run's processes, a GPU busy
with a process jobsup did not start is a note in ``queue`` and ``doctor``,
and an nvidia-smi that hangs or prints garbage never breaks anything."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from supervisord.shared import schemas
from tests.supervisord.jobsup_env import JobsupEnv
from tests.supervisord.ui.conftest import page_url
from tests.supervisord.ui.test_ui_http import _login

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

FAKE = """#!/bin/sh
# A fake nvidia-smi: the inventory, the compute apps listed in {apps}, and
# utilisation; {mode} may say "hang" or "garbage".
mode=$(cat {mode} 2>/dev/null)
case "$1" in
  --query-gpu=index,uuid,name,memory.total*)
    echo "0, GPU-aaaa-0000, NVIDIA Fake 80GB, 81920 MiB"
    echo "1, GPU-bbbb-1111, NVIDIA Fake 80GB, 81920 MiB" ;;
  --query-compute-apps=*)
    if [ "$mode" = hang ]; then sleep 30; fi
    if [ "$mode" = garbage ]; then printf 'Failed to initialize NVML: junk\\n,,,\\n\\001\\002\\n'; exit 0; fi
    cat {apps} 2>/dev/null ;;
  --query-gpu=index,uuid,utilization.gpu,memory.used*)
    echo "0, GPU-aaaa-0000, 37, 2048"
    echo "1, GPU-bbbb-1111, [N/A], 512" ;;
esac
"""


def _poll(what: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError("timed out")


def test_gpu_memory_per_run_foreign_processes_and_a_broken_nvidia_smi(
    js: JobsupEnv, repo: Path, tmp_path: Path
) -> None:
    apps, mode = tmp_path / "apps.csv", tmp_path / "mode"
    bin_dir = js.root / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(FAKE.format(apps=apps, mode=mode))
    smi.chmod(0o755)
    js.env["PATH"] = f"{bin_dir}:/usr/bin:/bin"
    js.daemon_config("local:\n  usage_interval_s: 0.5\n")
    js.start_daemon()
    # The job lists its own shell on GPU 0 (what CUDA would show), then runs.
    job = f'echo "GPU-aaaa-0000, $$, 1024" >> {apps}; sleep 4'
    rid = js.submit(repo, "--name", "g", "--gpus", "1", "--", job)
    # A process jobsup did not start, on GPU 1 (this test's own pid).
    with apps.open("a") as f:
        f.write(f"GPU-bbbb-1111, {os.getpid()}, 300\n")

    def row() -> dict[str, Any] | None:
        doc = json.loads(js.cli("top", "-o", "json").stdout)
        schemas.validate("top", doc)
        rows = [r for r in doc["runs"] if r["id"] == rid and r["gpu_memory_bytes"]]
        return rows[0] if rows else None

    got = _poll(row)
    assert got["gpus"] == [0] and got["gpu_memory_bytes"] == {"0": 1024 << 20}
    assert got["gpu_utilization"] == {"0": 37}
    queue = json.loads(js.cli("queue", "-o", "json").stdout)
    schemas.validate("queue", queue)
    assert any("GPU 1 is busy with a process jobsup did not start" in n for n in queue["notes"]), queue
    assert f"pid {os.getpid()}" in " ".join(queue["notes"])
    assert queue["gpus"][0]["utilization"] == 37 and queue["gpus"][1]["memory_used_bytes"] == 512 << 20
    doctor = {c["name"]: c for c in json.loads(js.cli("doctor", "-o", "json", check=False).stdout)}
    assert "GPU 1 is busy" in doctor["usage"]["detail"]
    # the page: the queue view per GPU, the run's times and GPUs
    client = _login(page_url(js))
    page = client.get("/queue").text
    assert "37%" in page and "GPU 1 is busy with a process jobsup did not start" in page
    js.cli("wait", rid, "--timeout", "60s")
    run = js.show(rid)
    assert run["usage"]["gpu_memory_max_bytes"] == {"0": 1024 << 20} and run["gpus"] == [0]
    page = client.get(f"/runs/{rid}").text
    assert 'id="elapsed" data-started="' + run["started_at"] in page
    assert "GPU 0 peak 1.0 GiB" in page and "peak memory" in page

    # nvidia-smi prints garbage, then hangs: runs go on, doctor says why GPU samples are missing.
    apps.write_text("")
    for state, needle in (("garbage", "could not read"), ("hang", "did not answer within")):
        mode.write_text(state)
        rid = js.submit(repo, "--name", f"g-{state}", "--gpus", "1", "--", "sleep 3")

        def note(needle: str = needle) -> bool:
            checks = {c["name"]: c for c in json.loads(js.cli("doctor", "-o", "json", check=False).stdout)}
            return needle in checks["usage"]["detail"]

        _poll(note)
        js.cli("wait", rid, "--timeout", "90s")
        assert js.show(rid)["phase"] == "COMPLETED"
    assert sys.executable  # (the daemon ran throughout)
    assert js.daemon is not None and js.daemon.poll() is None
