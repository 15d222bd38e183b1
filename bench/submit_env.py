"""Bench: what capturing and sending the submitting shell's environment adds
to a submit (target: at most 5 ms for 200 variables).

One private daemon; N pairs of ``POST /v1/runs`` (one in-process API
client, connection kept open), in alternating order, each a held run that
never starts (``hold``, ``force``):

* ``with``: the timed part also captures a 200-variable environment (names
  and values shaped like a real shell's: a few long PATH-like values, most
  short) the way the CLI does (:func:`supervisord.shared.shellenv.capture`) and
  sends it as ``shell_env``; the daemon checks it, records 200 keyed
  digests in Submitted and keeps the values in the run's pending file;
* ``without``: the same submit with no ``shell_env`` (the daemon's
  environment, as before).

The added cost is the median of the paired differences (with - without);
the parts are also timed in-process (client: capture + JSON encoding;
daemon: the check and the digests), where the machine's load adds less
noise. Prints a table, then one JSON line.

    python bench/submit_env.py           # N = 40 pairs
    python bench/submit_env.py --small   # N = 10 pairs
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from _harness import BenchEnv, Figure, load_average, make_repo, percentile, report
from supervisord.shared.shellenv import capture, check_shell_env, shell_env_digest

_VARS = 200


def shell_like_env(n: int = _VARS) -> dict[str, str]:
    """``n`` variables shaped like a developer shell's (about 14 KB)."""
    env = {
        "PATH": ":".join(f"/opt/tool{i}/bin" for i in range(40)),
        "LS_COLORS": "rs=0:di=01;34:ln=01;36:" * 40,
        "PYTHONPATH": "/src/a:/src/b:/src/c",
        "JOBSUP_STATE_DIR": "/dropped",
    }
    for i in range(n - len(env) + 1):
        env[f"VAR_{i:03d}_SETTING"] = f"value-{i}-" + "x" * (i % 50)
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="10 pairs instead of 40")
    parser.add_argument("-n", type=int, help="pairs")
    args = parser.parse_args()
    n = args.n or (10 if args.small else 40)
    shell = shell_like_env()

    # In-process parts (medians of 200 rounds).
    client_s, daemon_s = [], []
    key = os.urandom(32)
    for _ in range(200):
        t0 = time.perf_counter()
        captured = capture(shell)
        json.dumps({"shell_env": captured})
        t1 = time.perf_counter()
        shell_env_digest(check_shell_env(captured), key)
        t2 = time.perf_counter()
        client_s.append(t1 - t0)
        daemon_s.append(t2 - t1)

    with BenchEnv("submit-env") as env:
        repo = make_repo(env.root / "proj", {"README": "bench\n"})
        env.start_daemon()
        load_before = load_average()
        with_s: list[float] = []
        without_s: list[float] = []
        with env.client() as client:
            for i in range(n + 1):  # the first pair warms up (snapshot, imports, page cache)
                for kind in ("with", "without") if i % 2 == 0 else ("without", "with"):
                    body = {**env.submit_body(repo, "true", name=f"e{i}-{kind}"), "hold": True, "force": True}
                    t0 = time.perf_counter()
                    if kind == "with":
                        body["shell_env"] = capture(shell)
                    client.submit(body)
                    elapsed = time.perf_counter() - t0
                    if i:
                        (with_s if kind == "with" else without_s).append(elapsed)
        load_after = load_average()

    diffs = [w - wo for w, wo in zip(with_s, without_s, strict=True)]
    ms = 1000.0
    added = statistics.median(diffs) * ms
    figures = [
        Figure("submit_without_env_median_ms", statistics.median(without_s) * ms, "ms"),
        Figure("submit_with_200_vars_median_ms", statistics.median(with_s) * ms, "ms"),
        Figure("added_median_of_pairs_ms", added, "ms", "<= 5", added <= 5.0),
        Figure("added_p90_of_pairs_ms", percentile(diffs, 90) * ms, "ms"),
        Figure("client_capture_and_json_ms", statistics.median(client_s) * ms, "ms"),
        Figure("daemon_check_and_digests_ms", statistics.median(daemon_s) * ms, "ms"),
    ]
    report(
        "submit_env",
        figures,
        {
            "pairs": n,
            "variables": len(capture(shell)),
            "env_bytes": sum(len(k) + len(v) + 2 for k, v in capture(shell).items()),
            "load_before": load_before,
            "load_after": load_after,
            "cores": os.cpu_count(),
        },
    )


if __name__ == "__main__":
    main()
