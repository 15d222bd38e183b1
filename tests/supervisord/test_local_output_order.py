"""Interleaved stdout and stderr come back in the order the job wrote them
``logs`` and ``logs -o json`` show the lines in the
order the runner received them, each with its stream, also across a
``kill -9`` of the daemon."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from tests.supervisord.jobsup_env import JobsupEnv, make_repo

pytestmark = [pytest.mark.timeout(300), pytest.mark.daemon]  # js: the daemon runs

# Alternates "out I" on stdout and "err I" on stderr. After each line it
# waits until the runner has it in the output record (../output.log grows
# by the line), so the order the job wrote them is the order the runner
# received them, however loaded the machine; where there is no record (the
# code from before it) it sleeps 10 ms instead.
ALTERNATE = """\
n=$1; size=0
got() {
  if [ -e ../output.log ]; then
    until [ "$(stat -c %s ../output.log)" -ge "$1" ]; do sleep 0.002; done
  else
    sleep 0.01
  fi
}
for i in $(seq 1 "$n"); do
  echo "out $i"; size=$((size + ${#i} + 5)); got $size
  echo "err $i" >&2; size=$((size + ${#i} + 5)); got $size
done
"""

# No waiting: one line to each stream in turn, flushed, as fast as it goes.
FLOOD = """\
import sys
n = int(sys.argv[1])
for i in range(n):
    print(f"out {i}", flush=True)
    print(f"err {i}", file=sys.stderr, flush=True)
"""


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "proj", {"alternate.sh": ALTERNATE, "flood.py": FLOOD})


def _json_lines(js: JobsupEnv, run_id: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in js.cli("logs", run_id, "-o", "json").stdout.splitlines()]


def _alternating(n: int) -> list[tuple[str, str]]:
    return [pair for i in range(1, n + 1) for pair in (("stdout", f"out {i}"), ("stderr", f"err {i}"))]


def test_interleaved_output_keeps_the_order_it_was_written_in(js: JobsupEnv, repo: Path) -> None:
    n = 60
    run_id = js.submit(repo, "--", "bash", "alternate.sh", str(n))
    assert js.cli("wait", run_id, "--timeout", "3m", check=False).returncode == 0
    lines = _json_lines(js, run_id)
    assert [(ln["stream"], ln["text"]) for ln in lines] == _alternating(n)
    assert [ln["line_no"] for ln in lines] == list(range(1, 2 * n + 1))
    assert all(isinstance(ln["at"], str) and ln["at"] for ln in lines)
    # Plain `logs` shows them interleaved, all on stdout.
    assert js.cli("logs", run_id).stdout == "".join(text + "\n" for _, text in _alternating(n))


def _record_lines(run_dir: Path) -> list[tuple[str, str]]:
    """The lines of the output record as a plain reader sees them: split each
    stream's bytes at newlines, in the order the lines' ends are in output.log."""
    data = (run_dir / "output.log").read_bytes()
    index = (run_dir / "output.idx").read_bytes()
    switches = [(int.from_bytes(index[i : i + 7], "big"), index[i + 7]) for i in range(0, len(index), 8)]
    names = {0x31: "stdout", 0x32: "stderr"}
    partial = {"stdout": b"", "stderr": b""}
    out = []
    for k, (start, code) in enumerate(switches):
        end = switches[k + 1][0] if k + 1 < len(switches) else len(data)
        stream = names[code]
        *complete, partial[stream] = (partial[stream] + data[start:end]).split(b"\n")
        out.extend((stream, line.decode()) for line in complete)
    return out


def test_flushed_lines_without_pauses_come_in_the_order_received(js: JobsupEnv, repo: Path) -> None:
    n = 20_000  # 2 x 180 KB: more than a pipe holds, so the runner reads while the job writes
    run_id = js.submit(repo, "--config", "local.keep_log_files=true", "--", "python3", "flood.py", str(n))
    assert js.cli("wait", run_id, "--timeout", "3m", check=False).returncode == 0
    got = [(ln["stream"], ln["text"]) for ln in _json_lines(js, run_id)]
    # Each line once, with its stream, each stream in its own order ...
    assert [t for s, t in got if s == "stdout"] == [f"out {i}" for i in range(n)]
    assert [t for s, t in got if s == "stderr"] == [f"err {i}" for i in range(n)]
    # ... interleaved, not grouped per stream ...
    assert got.index(("stderr", "err 0")) < got.index(("stdout", f"out {n - 1}"))
    # ... and exactly in the order of the record the runner wrote.
    run_dir = js.state_dir / "runs" / run_id
    assert got == _record_lines(run_dir)


def test_kill_9_of_the_daemon_keeps_interleaved_lines_once_and_in_order(js: JobsupEnv, repo: Path) -> None:
    n = 400
    run_id = js.submit(repo, "--", "bash", "alternate.sh", str(n))
    deadline = time.monotonic() + 120
    while js.show(run_id)["log_lines"] < 100:
        assert time.monotonic() < deadline, "the run recorded no output"
        time.sleep(0.1)
    js.kill_daemon(signal.SIGKILL)
    time.sleep(1.0)  # the job keeps writing while no daemon runs
    js.start_daemon()
    assert js.cli("wait", run_id, "--timeout", "3m", check=False).returncode == 0
    lines = _json_lines(js, run_id)
    assert [(ln["stream"], ln["text"]) for ln in lines] == _alternating(n)
    assert [ln["line_no"] for ln in lines] == list(range(1, 2 * n + 1))
    # A later daemon start re-ingests nothing.
    js.stop_daemon()
    js.start_daemon()
    assert _json_lines(js, run_id) == lines
