"""Bench: hashing a run's outputs folder (target: at least 1 GB/s on one
core), beside ``sha256sum`` on the same files in the same run.

Writes a folder like a training run's outputs (a few large checkpoints and
many small files; 1 GiB in all by default), reads it once so both sides
hash from the page cache, then in alternating rounds:

* ``jobsup``: :func:`supervisord.shared.outputscan.scan` of the folder in a
  worker thread (as the daemon's recorder runs it: hashlib sha256, 1 MiB
  reads into one buffer), timed from the thread's start to its result;
* ``sha256sum``: coreutils' ``sha256sum`` over the same files (one process);
* the ceiling: hashlib's sha256 over bytes already in memory, no file reads.

Both hash the same bytes; the digests are checked to agree. Prints the
best and median throughput of each (GB/s, 10^9 bytes per second) and one
JSON line. CPU: whether it has SHA-NI (``sha_ni`` in /proc/cpuinfo).

    python bench/outputs_hash.py            # 1 GiB, 5 rounds
    python bench/outputs_hash.py --small    # 256 MiB, 3 rounds
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _harness import Figure, load_average, report
from supervisord.shared.outputscan import scan


def make_outputs(root: Path, total: int) -> list[Path]:
    """Files under ``root`` adding up to ``total`` bytes: 4 checkpoints
    holding 90% of it, the rest in 200 small files."""
    files: list[Path] = []
    big = total * 9 // 10 // 4
    (root / "ckpt").mkdir(parents=True)
    chunk = os.urandom(1 << 20)
    for i in range(4):
        p = root / "ckpt" / f"step{i}.pt"
        with p.open("wb") as f:
            left = big
            while left > 0:
                f.write(chunk[: min(left, len(chunk))])
                left -= len(chunk)
        files.append(p)
    small = (total - 4 * big) // 200
    (root / "logs").mkdir()
    for i in range(200):
        p = root / "logs" / f"m{i:03d}.json"
        p.write_bytes(os.urandom(small))
        files.append(p)
    return files


def _in_thread(root: Path) -> tuple[dict[str, Any], float]:
    out: dict[str, Any] = {}

    def work() -> None:
        t0 = time.perf_counter()
        out["data"] = scan(root)
        out["s"] = time.perf_counter() - t0

    t = threading.Thread(target=work)
    t.start()
    t.join()
    return out["data"], out["s"]


def hashlib_ceiling(nbytes: int = 256 << 20) -> float:
    """sha256 of ``nbytes`` already in memory (1 MiB updates), GB/s: the
    most any reader of files can reach on this core, now."""
    import hashlib

    buf = os.urandom(1 << 20)
    h = hashlib.sha256()
    t0 = time.perf_counter()
    for _ in range(nbytes >> 20):
        h.update(buf)
    return nbytes / (time.perf_counter() - t0) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="256 MiB and 3 rounds")
    parser.add_argument("--mib", type=int, help="total size in MiB")
    parser.add_argument("--rounds", type=int)
    args = parser.parse_args()
    total = (args.mib or (256 if args.small else 1024)) << 20
    rounds = args.rounds or (3 if args.small else 5)
    shani = "sha_ni" in Path("/proc/cpuinfo").read_text()
    sha256sum = shutil.which("sha256sum")
    if sha256sum is None:
        raise SystemExit("sha256sum is not on PATH")
    base = Path(tempfile.mkdtemp(prefix="jobsup-bench-outputs-"))
    try:
        root = base / "out"
        files = make_outputs(root, total)
        nbytes = sum(p.stat().st_size for p in files)
        subprocess.run(["cat", *map(str, files)], stdout=subprocess.DEVNULL, check=True)  # into the page cache
        load_before = load_average()
        ours: list[float] = []
        theirs: list[float] = []
        ceiling: list[float] = []
        for i in range(rounds):
            ceiling.append(hashlib_ceiling())
            for kind in ("jobsup", "sha256sum") if i % 2 == 0 else ("sha256sum", "jobsup"):
                if kind == "jobsup":
                    data, secs = _in_thread(root)
                    ours.append(secs)
                else:
                    t0 = time.perf_counter()
                    proc = subprocess.run(
                        [sha256sum, *(str(p.relative_to(root)) for p in files)],
                        cwd=root, capture_output=True, text=True, check=True,
                    )  # fmt: skip
                    theirs.append(time.perf_counter() - t0)
                    peer = dict(reversed(line.split("  ", 1)) for line in proc.stdout.splitlines())
        mine = {f["path"]: f["sha256"] for f in data["files"]}
        if mine != peer or data["total_bytes"] != nbytes:
            raise SystemExit("the digests differ from sha256sum's")
        load_after = load_average()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    gb = nbytes / 1e9
    best, med = gb / min(ours), gb / statistics.median(ours)
    figures = [
        Figure("jobsup_scan_best_gb_s", best, "GB/s", ">= 1", best >= 1.0),
        Figure("jobsup_scan_median_gb_s", med, "GB/s"),
        Figure("sha256sum_best_gb_s", gb / min(theirs), "GB/s"),
        Figure("sha256sum_median_gb_s", gb / statistics.median(theirs), "GB/s"),
        Figure("hashlib_in_memory_best_gb_s", max(ceiling), "GB/s"),
    ]
    report(
        "outputs_hash",
        figures,
        {
            "bytes": nbytes,
            "files": len(files),
            "rounds": rounds,
            "sha_ni": shani,
            "load_before": load_before,
            "load_after": load_after,
            "cores": os.cpu_count(),
        },
    )


if __name__ == "__main__":
    main()
