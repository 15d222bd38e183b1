"""The scheduler end to end: the real daemon and CLI, real local jobs that
record their GPUs and start/end times, a fake ``nvidia-smi`` on PATH."""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path
from typing import Any

import pytest

from tests.supervisord.jobsup_env import JobsupEnv, make_repo

pytestmark = pytest.mark.timeout(300)

REC = (
    "import json, os, sys, time\n"
    "out, tag, secs = sys.argv[1], sys.argv[2], sys.argv[3]\n"
    "def rec(kind):\n"
    "    line = json.dumps({'tag': tag, 'kind': kind, 't': time.time(),\n"
    "        'cvd': os.environ.get('CUDA_VISIBLE_DEVICES'), 'order': os.environ.get('CUDA_DEVICE_ORDER'),\n"
    "        'gpus': os.environ.get('JOBSUP_GPUS'), 'secret': os.environ.get('TOKEN')})\n"
    "    with open(out, 'a') as f: f.write(line + '\\n')\n"
    "rec('start')\n"
    "if secs.startswith('until:'):\n"
    "    while not os.path.exists(secs[6:]): time.sleep(0.05)\n"
    "else: time.sleep(float(secs))\n"
    "rec('end')\n"
    "sys.exit(int(sys.argv[4]) if len(sys.argv) > 4 else 0)\n"
)


def _configure(js: JobsupEnv, daemon_yaml: str | None, fake_smi: str | None = None) -> None:
    """Before its daemon starts: ``daemon_yaml`` as the daemon's config, and
    PATH with a fake ``nvidia-smi`` printing ``fake_smi`` (None: none)."""
    if daemon_yaml is not None:
        js.daemon_config(daemon_yaml)
    if fake_smi is not None:
        js.fake_nvidia_smi(fake_smi)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "proj", {"rec.py": REC})


@pytest.fixture
def four(js: JobsupEnv) -> JobsupEnv:
    """A daemon with 4 GPUs and a queue ``two`` of at most 2 runs at once."""
    _configure(js, "scheduler:\n  gpus: [0, 1, 2, 3]\n  queues:\n    two: {max_parallel: 2}\n")
    js.start_daemon()
    return js


def _submit(js: JobsupEnv, repo: Path, out: Path, tag: str, secs: float | str, *flags: str, code: int = 0) -> str:
    import sys

    return js.submit(repo, "--name", tag, *flags, "--", f"{sys.executable} rec.py {out} {tag} {secs} {code}")


def _records(out: Path) -> dict[str, dict[str, Any]]:
    recs: dict[str, dict[str, Any]] = {}
    if not out.exists():
        return recs
    for line in out.read_text().splitlines():
        r = json.loads(line)
        d = recs.setdefault(r["tag"], {"starts": 0})
        if r["kind"] == "start":
            d["starts"] += 1
            d.update(start=r["t"], cvd=r["cvd"], order=r["order"], gpus=r["gpus"], secret=r["secret"])
        else:
            d["end"] = r["t"]
    return recs


def _wait_all(js: JobsupEnv, ids: list[str], timeout: str = "240s") -> list[dict[str, Any]]:
    w = js.cli("wait", *ids, "--timeout", timeout, "-o", "json", check=False)
    assert w.returncode in (0, 1, 3), w.stderr
    return list(json.loads(w.stdout))


def _events(js: JobsupEnv, run_id: str) -> list[dict[str, Any]]:
    return [json.loads(l) for l in js.cli("events", run_id, "-o", "json").stdout.splitlines()]


def _wait_until(pred: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


def _overlaps(recs: dict[str, dict[str, Any]]) -> list[tuple[str, str, str]]:
    bad = []
    items = [(t, r) for t, r in recs.items() if r.get("cvd")]
    for i, (ta, a) in enumerate(items):
        for tb, b in items[i + 1 :]:
            shared = set(a["cvd"].split(",")) & set(b["cvd"].split(","))
            if shared and a["start"] < b["end"] and b["start"] < a["end"]:
                bad.append((ta, tb, ",".join(shared)))
    return bad


@pytest.mark.gpus
def test_auto_gpus_from_nvidia_smi_env_and_doctor(js: JobsupEnv, tmp_path: Path, repo: Path) -> None:
    smi = "0, GPU-aaaa-0000, NVIDIA Fake 80GB, 81920 MiB\n1, GPU-bbbb-1111, NVIDIA Fake 80GB, 81920 MiB\n"
    _configure(js, None, fake_smi=smi)
    js.start_daemon()
    out = tmp_path / "rec.jsonl"
    one = _submit(js, repo, out, "one", 0.1, "--gpus", "1", "--env", "TOKEN=t0k")
    cpu = _submit(js, repo, out, "cpu", 0.1)
    _wait_all(js, [one, cpu])
    recs = _records(out)
    assert recs["one"]["cvd"] == "GPU-aaaa-0000" and recs["one"]["order"] == "PCI_BUS_ID"
    assert recs["one"]["gpus"] == "0" and recs["one"]["secret"] == "t0k"
    assert recs["cpu"]["cvd"] == ""  # the daemon manages GPUs: CPU runs see none
    admitted = [e for e in _events(js, one) if e["type"] == "Admitted"]
    assert admitted[0]["data"]["gpus"][0]["uuid"] == "GPU-aaaa-0000"
    assert any(e["type"] == "ResourcesFreed" for e in _events(js, one))
    checks = json.loads(js.cli("doctor", "-o", "json", check=False).stdout)
    gpu_check = next(c for c in checks if c["name"] == "gpus")
    assert "2 GPU(s) from nvidia-smi" in gpu_check["detail"]
    r = js.cli("submit", "--name", "big", "--gpus", "3", "--", "true", cwd=repo, check=False)
    assert r.returncode == 2 and "--gpus" in r.stderr and "has 2" in r.stderr


@pytest.mark.gpus
def test_no_nvidia_smi_is_a_doctor_note(js: JobsupEnv, tmp_path: Path, repo: Path) -> None:
    _configure(js, None)
    js.start_daemon()
    checks = json.loads(js.cli("doctor", "-o", "json", check=False).stdout)
    gpu_check = next(c for c in checks if c["name"] == "gpus")
    assert gpu_check["ok"] and "nvidia-smi is not on PATH" in gpu_check["detail"]
    r = js.cli("submit", "--gpus", "1", "--", "true", cwd=repo, check=False)
    assert r.returncode == 2 and "has 0" in r.stderr
    out = tmp_path / "rec.jsonl"
    cpu = _submit(js, repo, out, "cpu", 0.1)
    _wait_all(js, [cpu])
    assert _records(out)["cpu"]["cvd"] is None  # no GPUs managed: env untouched


@pytest.mark.timeout(1200)  # 30 CLI submits: minutes on a loaded machine
def test_randomized_30_runs_never_share_a_gpu(four: JobsupEnv, repo: Path, tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("JOBSUP_TEST_SEED", "15")))
    out = tmp_path / "rec.jsonl"
    want: dict[str, int] = {}
    ids = []
    for i in range(30):
        n = rng.randint(0, 3)
        want[f"r{i}"] = n
        ids.append(
            _submit(
                four,
                repo,
                out,
                f"r{i}",
                rng.choice([0.2, 0.5, 1.0]),
                "--gpus",
                str(n),
                "--priority",
                str(rng.randint(-1, 1)),
            )
        )
    runs = _wait_all(four, ids)
    assert all(r["phase"] == "COMPLETED" for r in runs), runs
    recs = _records(out)
    assert len(recs) == 30 and all(r["starts"] == 1 for r in recs.values())
    for tag, n in want.items():
        got = recs[tag]["cvd"]
        assert (len(got.split(",")) if got else 0) == n, (tag, got)
    assert _overlaps(recs) == []


@pytest.mark.gpus
def test_priority_then_fifo(four: JobsupEnv, repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "rec.jsonl"
    blocker = _submit(four, repo, out, "blocker", 60, "--gpus", "4")
    _wait_until(lambda: "blocker" in _records(out))
    a = _submit(four, repo, out, "a", 0.2, "--gpus", "4")
    b = _submit(four, repo, out, "b", 0.2, "--gpus", "4")
    c = _submit(four, repo, out, "c", 0.2, "--gpus", "4", "--priority", "5")
    queued = json.loads(four.cli("queue", "-o", "json").stdout)
    assert [w["id"] for w in queued["waiting"]] == [c, a, b]
    assert queued["waiting"][0]["reason"] == "WaitingForGPUs"
    assert "needs 4 GPUs, 0 free: GPU 0 held by run " + blocker in queued["waiting"][0]["message"]
    assert all(g["holder"]["id"] == blocker for g in queued["gpus"])
    assert four.show(a)["phase"] == "QUEUED" and four.show(a)["reason"] == "WaitingForGPUs"
    canceled_at = time.time()
    four.cli("cancel", blocker)
    _wait_all(four, [blocker, a, b, c])
    recs = _records(out)
    assert sorted(recs, key=lambda t: recs[t]["start"]) == ["blocker", "c", "a", "b"]
    assert recs["c"]["start"] > canceled_at
    # The pending reason is recorded when it changes, not on every pass: b
    # waited behind the run holding the reservation (named in its message:
    # a, then c once c came first, then a again), then held it itself.
    queued_b = [e for e in _events(four, b) if e["type"] == "PhaseChanged" and e["data"]["phase"] == "QUEUED"]
    assert 1 <= len(queued_b) <= 5, queued_b
    messages = [e["data"]["message"] for e in queued_b]
    assert all(x != y for x, y in zip(messages, messages[1:], strict=False)), messages  # never twice in a row
    del recs["blocker"]  # canceled: it recorded no end
    assert _overlaps(recs) == []


def test_backfill_and_no_starvation_of_a_4_gpu_run(four: JobsupEnv, repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "rec.jsonl"
    # Two 1-GPU runs hold GPUs 0 and 1 (timeout 1h); then the 4-GPU run.
    gate = tmp_path / "gate"
    ids = [_submit(four, repo, out, f"s{i}", f"until:{gate}", "--gpus", "1", "--timeout", "1h") for i in range(2)]
    _wait_until(lambda: len(_records(out)) == 2)
    big = _submit(four, repo, out, "big", 0.5, "--gpus", "4", "--timeout", "1h")
    # A stream of 1-GPU runs with the same priority and timeout: none may
    # take the GPUs the big run waits for.
    stream = []
    for i in range(4):
        stream.append(_submit(four, repo, out, f"t{i}", 0.5, "--gpus", "1", "--timeout", "1h"))
        time.sleep(0.3)
    # A short run (timeout 10s) ends before the big run could start anyway: it backfills.
    short = _submit(four, repo, out, "short", 0.2, "--gpus", "1", "--timeout", "10s")
    _wait_all(four, [short], timeout="60s")
    assert four.show(big)["phase"] == "QUEUED" and all(four.show(t)["phase"] == "QUEUED" for t in stream)
    gate.write_text("")
    _wait_all(four, [*ids, big, *stream, short])
    recs = _records(out)
    assert recs["short"]["start"] < recs["big"]["start"], "the short run should backfill a free GPU"
    for i in range(4):
        assert recs[f"t{i}"]["start"] >= recs["big"]["end"] - 0.05, f"t{i} started before the 4-GPU run"
    assert _overlaps(recs) == []
    assert any(e["data"].get("reason") == "WaitingForGPUs" for e in _events(four, big) if e["type"] == "PhaseChanged")


def test_max_parallel_caps_a_queue(four: JobsupEnv, repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "rec.jsonl"
    gate = tmp_path / "gate"
    ids = [_submit(four, repo, out, f"q{i}", f"until:{gate}", "--queue", "two") for i in range(5)]
    other = _submit(four, repo, out, "other", 0.1)  # another queue is not capped
    _wait_until(lambda: len(_records(out)) == 3)
    shown = [four.show(i) for i in ids]
    assert [r["phase"] for r in shown].count("QUEUED") == 3
    assert {r["reason"] for r in shown if r["phase"] == "QUEUED"} == {"WaitingForSlot"}
    assert "max_parallel 2" in next(r["message"] for r in shown if r["phase"] == "QUEUED")
    gate.write_text("")
    runs = _wait_all(four, [*ids, other])
    assert all(r["phase"] == "COMPLETED" for r in runs)
    recs = _records(out)
    del recs["other"]
    points = sorted([(r["start"], 1) for r in recs.values()] + [(r["end"], -1) for r in recs.values()])
    live = peak = 0
    for _, d in points:
        live += d
        peak = max(peak, live)
    assert peak == 2


def test_dependency_chain_with_a_failure(four: JobsupEnv, repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "rec.jsonl"
    gate = tmp_path / "gate"
    a = _submit(four, repo, out, "a", f"until:{gate}")
    b = _submit(four, repo, out, "b", 0.2, "--after", a, code=1)
    c = _submit(four, repo, out, "c", 0.1, "--after", b)
    e = _submit(four, repo, out, "e", 0.1, "--after", c[:6])
    d = _submit(four, repo, out, "d", 0.1, "--after-any", b)
    shown = four.show(c)
    assert shown["phase"] == "QUEUED" and shown["reason"] == "WaitingForDependency" and b in shown["message"]
    gate.write_text("")
    runs = {r["id"]: r for r in _wait_all(four, [a, b, c, d, e])}
    assert runs[a]["phase"] == "COMPLETED" and runs[b]["phase"] == "ERROR"
    assert runs[c]["phase"] == "CANCELED" and runs[c]["reason"] == "DependencyFailed" and b in runs[c]["message"]
    assert runs[e]["phase"] == "CANCELED" and runs[e]["reason"] == "DependencyFailed"
    assert runs[d]["phase"] == "COMPLETED"
    recs = _records(out)
    assert "c" not in recs and "e" not in recs
    assert recs["b"]["start"] >= recs["a"]["end"] and recs["d"]["start"] >= recs["b"]["end"]
    # A dependency that is already terminal is resolved at once.
    f = _submit(four, repo, out, "f", 0.1, "--after", a)
    g = _submit(four, repo, out, "g", 0.1, "--after", b)
    runs = {r["id"]: r for r in _wait_all(four, [f, g], timeout="60s")}
    assert runs[f]["phase"] == "COMPLETED" and runs[g]["reason"] == "DependencyFailed"
    # A rerun that would end DependencyFailed at once is refused, naming the
    # dead dependency (it was submitted, exit 0, then failed); nothing recorded.
    before = len(json.loads(four.cli("runs", "--all", "-o", "json").stdout))
    r = four.cli("rerun", g, check=False)
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout, r.stderr)
    assert f"run {b}, which ended ERROR (NonZeroExit)" in r.stderr and f"rerun {b} first" in r.stderr, r.stderr
    assert len(json.loads(four.cli("runs", "--all", "-o", "json").stdout)) == before
    again = four.cli("rerun", f).stdout.strip()  # its dependency COMPLETED: runs
    assert _wait_all(four, [again], timeout="60s")[0]["phase"] == "COMPLETED"


def test_hold_release_and_cancel_of_queued_runs(four: JobsupEnv, repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "rec.jsonl"
    h = _submit(four, repo, out, "h", 0.1, "--hold")
    _wait_until(lambda: four.show(h)["reason"] == "Held")
    assert four.show(h)["phase"] == "QUEUED"
    x = _submit(four, repo, out, "x", 0.1)
    four.cli("hold", x, check=False)  # may already have started: then a clear error
    k = _submit(four, repo, out, "k", 30, "--hold")
    four.cli("hold", k)  # holding a held run is a no-op
    canceled = four.cli("cancel", k, "-o", "json")
    assert json.loads(canceled.stdout)[0]["phase"] == "CANCELED"
    types = [e["type"] for e in _events(four, k)]
    assert "Admitted" not in types and types[-1] == "PhaseChanged"
    time.sleep(0.5)
    assert "h" not in _records(out)
    four.cli("release", h)
    runs = _wait_all(four, [h, x])
    assert all(r["phase"] == "COMPLETED" for r in runs)
    types = [e["type"] for e in _events(four, h)]
    assert types.index("HoldReleased") < types.index("Admitted")
    r = four.cli("hold", h, check=False)
    assert r.returncode == 2 and "only a queued run can be held" in r.stderr
    assert "k" not in _records(out)


def test_rerun_takes_env_from_the_environment(four: JobsupEnv, repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "rec.jsonl"
    first = _submit(four, repo, out, "job", 0.1, "--gpus", "2", "--env", "TOKEN=one", "--priority", "3")
    _wait_all(four, [first])
    r = four.cli("rerun", first, extra_env={"TOKEN": "two"})
    second = r.stdout.strip()
    assert len(second) == 12 and second != first
    _wait_all(four, [second])
    sub1, sub2 = four.show(first), four.show(second)
    assert sub2["source"]["commit"] == sub1["source"]["commit"] and sub2["command"] == sub1["command"]
    doc = json.loads(four.cli("show", second, "-o", "json").stdout)
    assert doc["name"] == "job"
    lines = out.read_text().splitlines()
    assert json.loads(lines[-1])["secret"] == "two" and len(json.loads(lines[-1])["cvd"].split(",")) == 2
    r = four.cli("rerun", first)
    assert "TOKEN" in r.stderr and "no value" in r.stderr
    _wait_all(four, [r.stdout.strip()])


def test_bad_input_is_refused_with_the_flag_named(four: JobsupEnv, repo: Path) -> None:
    cases = [
        (["--gpus", "-1"], "--gpus"),
        (["--gpus", "5"], "--gpus"),
        (["--after", "ffff00000000"], "--after"),
        (["--after-any", "zz"], "--after-any"),
        (["--priority", "2000"], "--priority"),
        (["--queue", "bad name"], "--queue"),
        (["--backend", "kubernetes", "--gpus", "1"], "--gpus"),
    ]
    for flags, flag in cases:
        r = four.cli("submit", *flags, "--", "true", cwd=repo, check=False)
        assert r.returncode == 2, (flags, r.stderr)
        assert flag in r.stderr, (flags, r.stderr)
    assert json.loads(four.cli("runs", "--all", "-o", "json").stdout) == []


def test_in_flight_guard_counts_queued_runs(four: JobsupEnv, repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "rec.jsonl"
    held = _submit(four, repo, out, "same", 0.1, "--hold")
    r = four.cli("submit", "--name", "same", "--", "true", cwd=repo, check=False)
    assert r.returncode == 1 and held in r.stderr
    forced = four.submit(repo, "--name", "same", "--force", "--", "true")
    four.cli("cancel", held)
    _wait_all(four, [forced])


def test_queue_output_formats(four: JobsupEnv, repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "rec.jsonl"
    h = _submit(four, repo, out, "h", 0.1, "--hold", "--gpus", "1")
    _wait_until(lambda: four.show(h)["reason"] == "Held")
    doc = json.loads(four.cli("queue", "-o", "json").stdout)
    assert doc["waiting"][0]["id"] == h and doc["waiting"][0]["reason"] == "Held"
    assert [g["index"] for g in doc["gpus"]] == [0, 1, 2, 3]
    import yaml

    assert yaml.safe_load(four.cli("queue", "-o", "yaml").stdout)["waiting"][0]["id"] == h
    table = four.cli("queue").stdout
    assert h in table and "Held" in table and "free" in table
    four.cli("cancel", h)


def test_kill_9_keeps_holders_and_queue(four: JobsupEnv, repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "rec.jsonl"
    gate = tmp_path / "gate"
    ids = [_submit(four, repo, out, f"k{i}", f"until:{gate}", "--gpus", "2", "--env", "TOKEN=tk") for i in range(5)]
    _wait_until(lambda: len(_records(out)) == 2)
    before = json.loads(four.cli("queue", "-o", "json").stdout)
    four.kill_daemon()
    four.start_daemon()
    after = json.loads(four.cli("queue", "-o", "json").stdout)
    assert [g["holder"] and g["holder"]["id"] for g in after["gpus"]] == [
        g["holder"] and g["holder"]["id"] for g in before["gpus"]
    ]
    assert [w["id"] for w in after["waiting"]] == [w["id"] for w in before["waiting"]] == ids[2:]
    gate.write_text("")
    runs = _wait_all(four, ids)
    assert all(r["phase"] == "COMPLETED" for r in runs), runs
    recs = _records(out)
    assert all(r["starts"] == 1 for r in recs.values()) and len(recs) == 5
    # Runs that waited through the restart still got their env values.
    assert all(r["secret"] == "tk" for r in recs.values())
    # Queued runs are admitted in their order. (k2 and k3 are admitted on the
    # GPUs k0 and k1 free at about the same moment, so when each job itself
    # starts running is a race; the admission order is the scheduler's word.)
    admitted = {
        name: next(e["seq"] for e in _events(four, rid) if e["type"] == "Admitted")
        for name, rid in zip(["k0", "k1", "k2", "k3", "k4"], ids)
    }
    assert sorted(admitted, key=admitted.__getitem__)[2:] == ["k2", "k3", "k4"]
    assert recs["k4"]["start"] >= min(recs["k2"]["end"], recs["k3"]["end"]) - 0.05
    assert _overlaps(recs) == []
