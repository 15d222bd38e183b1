"""C16: a run's log archive swapped for another file while `jobsup logs`
replays it. The reply's next page read the new file, failed its digest
check mid-stream, and the stream ended as "lost the jobsup daemon" (exit
69) after a correct prefix, with a traceback in the daemon log. A reply
now reads the archive through the descriptor it checked before it started:
the whole text, exactly; the next reply reports the swap (exit 1)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.supervisord.jobsup_env import JobsupEnv, make_repo

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

# Several bursts with pauses: several stored blocks, so the reply reads the
# archive more than once.
EMIT = (
    "import sys, time\n"
    "for k in range(6):\n"
    "    sys.stdout.write(''.join('line %07d %s\\n' % (k * 40000 + i, 'y' * 60) for i in range(40000)))\n"
    "    sys.stdout.flush(); time.sleep(0.4)\n"
)


def test_an_archive_swapped_during_a_replay_is_read_whole_from_the_file_checked(js: JobsupEnv, tmp_path: Path) -> None:
    js.start_daemon()
    repo = make_repo(tmp_path / "proj", {"emit.py": EMIT})
    run_id = js.submit(repo, "--", f"{sys.executable} emit.py")
    assert js.cli("wait", run_id, "--timeout", "120s", check=False).returncode == 0
    expected = "".join(f"line {i:07d} {'y' * 60}\n" for i in range(240000)).encode()
    json.loads(js.cli("prune", "--older-than", "0s", "-o", "json").stdout)
    archive = js.state_dir / "archive" / f"{run_id}.jslog"
    good = archive.read_bytes()
    transport = httpx.HTTPTransport(uds=str(js.socket))
    with httpx.Client(transport=transport, base_url="http://jobsup", timeout=60) as client:
        with client.stream("GET", f"/v1/runs/{run_id}/logs") as reply:
            assert reply.status_code == 200
            chunks = reply.iter_raw(65536)
            got = [next(chunks)]
            time.sleep(1)  # the daemon stops at the full socket, a page or so ahead
            forged = archive.with_name("forged")
            forged.write_bytes(good[:8] + bytes(len(good) - 8))
            forged.chmod(0o600)
            forged.replace(archive)
            got.extend(chunks)
    assert b"".join(got) == expected
    assert "Traceback" not in js.daemon_log.read_text()
    r = js.cli("logs", run_id, check=False)  # a new reply: the swap is an error, never text
    assert r.returncode == 1 and r.stdout == "" and "does not match the digest" in r.stderr, r.stderr
