"""triage's reason-specific next steps: the peak and limit of a run stopped
for its memory and the --memory to give, the timeout a run hit, the
reservation a run waiting for GPUs is behind and the --timeout that would
start it now."""

from __future__ import annotations

from typing import Any

from supervisord.client.cli.triage_hints import effective_limits, next_memory, short_duration
from supervisord.client.mcp.server import triage_suggestion
from supervisord.shared.limits import parse_memory
from supervisord.shared.task import parse_duration

M, G = 1 << 20, 1 << 30


def _detail(memory: int | None = None, timeout_s: int = 3600, gpus: int = 0, updates: Any = ()) -> dict[str, Any]:
    sched: dict[str, Any] = {"gpus": gpus}
    if memory is not None:
        sched["memory_bytes"] = memory
    return {
        "submitted": {"timeout_s": timeout_s, "scheduling": sched},
        "updates": [{"type": "RunUpdated", "data": {"new": u}} for u in updates],
    }


def test_next_memory_gives_headroom_in_round_values_parse_memory_takes() -> None:
    assert next_memory(100 * M) == "128M"
    assert next_memory(700 * M) == "896M"
    assert next_memory(900 * M) == "1.5G"
    assert next_memory(3 * G) == "4G"
    assert next_memory(10 * M, limit=64 * M) == "128M"  # never below the old limit plus a quarter
    for peak in (1 * M, 333 * M, 999 * M, 5 * G + 1):
        assert parse_memory(next_memory(peak)) >= peak * 1.25


def test_short_duration_is_one_unit_parse_duration_takes_and_never_longer() -> None:
    for seconds in (30, 61, 3599, 3 * 3600 + 59, 2 * 86400 + 5, 10 * 86400):
        text = short_duration(seconds)
        assert parse_duration(text) <= max(60, seconds), (seconds, text)
    assert short_duration(5400) == "90m" and short_duration(4 * 3600 + 1) == "4h"


def test_effective_limits_fold_the_updates_in_order() -> None:
    detail = _detail(memory=64 * M, updates=[{"memory_bytes": 128 * M}, {"timeout_s": 60}])
    assert effective_limits(detail) == {"memory_bytes": 128 * M, "timeout_s": 60, "gpus": 0}
    assert effective_limits(None) == {"memory_bytes": None, "timeout_s": None, "gpus": None}


def test_oom_names_the_peak_and_the_limit_and_the_memory_to_give() -> None:
    run = {"id": "abc123abc123", "phase": "ERROR", "reason": "OOMKilled", "backend": "local"}
    run["usage"] = {"max_rss_bytes": 150 * M, "cpu_s": 1.0}
    text = triage_suggestion(run, _detail(memory=64 * M))
    assert "peaked at 150M" in text and "limit of 64M" in text and "--memory 192M" in text, text
    assert "jobsup rerun abc123abc123 --hold" in text and "batch size" in text
    # No peak recorded: the generic local advice, not Kubernetes'.
    bare = triage_suggestion({"phase": "ERROR", "reason": "OOMKilled", "backend": "local"})
    assert "--memory" in bare and "k8s.yaml" not in bare
    k8s = triage_suggestion({"phase": "ERROR", "reason": "OOMKilled", "backend": "kubernetes", "usage": run["usage"]})
    assert "k8s.yaml" in k8s


def test_deadline_names_the_timeout_and_a_longer_one() -> None:
    run = {"id": "r", "phase": "ERROR", "reason": "DeadlineExceeded", "backend": "local"}
    text = triage_suggestion(run, _detail(timeout_s=1800))
    assert "timeout of 30m" in text and "--timeout 60m" in text, text
    assert "--timeout" in triage_suggestion(run)  # without the detail: the generic advice


def _queue(run_id: str, backfill: int, free: int) -> dict[str, Any]:
    gpus = [{"index": i, "holder": None if i < free else {"id": "h"}} for i in range(4)]
    message = f"GPUs 0-3 reserved for run {run_id} (needs 4) from about 14:05 UTC"
    return {
        "gpus": gpus,
        "reservation": {
            "run_id": run_id,
            "needs": 4,
            "gpus": [0, 1, 2, 3],
            "backfill_timeout_s": backfill,
            "message": message,
        },
    }


def test_waiting_for_gpus_explains_the_reservation_and_the_timeout_that_starts_it() -> None:
    run = {"id": "small0000000", "phase": "QUEUED", "reason": "WaitingForGPUs"}
    text = triage_suggestion(run, _detail(gpus=1, timeout_s=4 * 3600), _queue("head00000000", 5400, free=1))
    assert "reserved for run head00000000 (needs 4)" in text, text
    assert "`jobsup update small0000000 --timeout 89m` would let it start now" in text, text
    # Its timeout is short enough already, or it needs more GPUs than are free: no timeout advice.
    short = triage_suggestion(run, _detail(gpus=1, timeout_s=600), _queue("head00000000", 5400, free=1))
    assert "reserved for run head00000000" in short and "jobsup update" not in short
    big = triage_suggestion(run, _detail(gpus=2, timeout_s=4 * 3600), _queue("head00000000", 5400, free=1))
    assert "jobsup update" not in big
    # The head itself holds the reservation.
    head = {"id": "head00000000", "phase": "QUEUED", "reason": "WaitingForGPUs"}
    own = triage_suggestion(head, _detail(gpus=4), _queue("head00000000", 5400, free=1))
    assert own.count("this run holds the backfill reservation") == 1, own
    # No reservation: the generic advice.
    assert triage_suggestion(run, _detail(gpus=1), {"gpus": [], "reservation": None}).startswith("not enough free GPUs")
