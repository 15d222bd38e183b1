"""Hook delivery against a real event store (SQLite file) and a real local
HTTP server: webhook body, headers and HMAC; retries (500 then 200, 429
with Retry-After), permanent failures (400); command hooks; checkpoints;
new hooks starting at the end of the log; 200 runs x 3 hooks exactly once."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Collection, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

from store import Append, EventStore, NewEvent, RecordedEvent, StoreError, StoreLockedError
from supervisord.daemon.hooks import delivery
from supervisord.daemon.hooks.delivery import FLUSH_S, HOOK_DELIVERED, HOOK_FAILED, HookService
from supervisord.shared.hooksconfig import HookSpec, WebhookTarget
from tests.supervisord.hooks.webhook_server import Reply, WebhookServer

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

TERMINAL = frozenset({"COMPLETED", "ERROR", "CANCELED", "DELETED"})


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[EventStore]:
    s = await EventStore.open(tmp_path / "jobsup.db", synchronous="NORMAL")
    try:
        yield s
    finally:
        await s.close()


async def _run(
    store: EventStore, run_id: str, phases: Sequence[str] = ("RUNNING", "COMPLETED"), **fields: Any
) -> list[RecordedEvent]:
    """Record a run: Submitted, some log lines, then ``phases``."""
    submitted = {"project": "proj", "name": "train", "backend": "local", "command": "python train.py", **fields}
    events = [NewEvent("Submitted", submitted)]
    events.append(
        NewEvent(
            "LogLines", {"stream": "stdout", "source": "stdout", "lines": [[str(i), f"line {i}"] for i in range(60)]}
        )
    )
    for p in phases:
        data: dict[str, Any] = {"phase": p, "reason": None, "message": None}
        if p == "COMPLETED":
            data["exit_code"] = 0
        if p == "ERROR":
            data.update(reason="NonZeroExit", exit_code=3)
        events.append(NewEvent("PhaseChanged", data))
    return await store.append(run_id, 0, events)


async def _outcomes(store: EventStore, n: int, timeout: float = 30.0) -> list[RecordedEvent]:
    """Wait until ``n`` hook outcome events are recorded; return them all."""
    with anyio.fail_after(timeout):
        while True:
            found = await store.read_all(0, limit=100_000, types=[HOOK_DELIVERED, HOOK_FAILED])
            if len(found) >= n:
                return found
            await store.wait_for_events(found[-1].seq if found else 0, types=[HOOK_DELIVERED, HOOK_FAILED], timeout_s=1)


def _webhook(name: str, url: str, **kw: Any) -> HookSpec:
    target = WebhookTarget(
        url,
        secret_env=kw.pop("secret_env", None),
        timeout_s=kw.pop("timeout_s", 5),
        retry_for_s=kw.pop("retry_for_s", 3600),
        in_flight=kw.pop("in_flight", 1),
    )
    return HookSpec(name=name, when=kw.pop("when", TERMINAL), webhook=target, **kw)


class Running:
    """A HookService running in a task group for the test's body."""

    def __init__(self, store: EventStore, hooks: Sequence[HookSpec], env: dict[str, str] | None = None) -> None:
        self.service = HookService(store, hooks, env=env or {"PATH": "/usr/bin:/bin"})

    async def __aenter__(self) -> HookService:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self.service.run)
        # Every hook has its checkpoint before the test records anything.
        with anyio.fail_after(10):
            while not {r.spec.checkpoint_name for r in self.service.runners} <= set(
                await self.service.store.checkpoints()
            ):
                await anyio.sleep(0.01)
        return self.service

    async def __aexit__(self, *exc: object) -> None:
        self._tg.cancel_scope.cancel()
        await self._tg.__aexit__(None, None, None)


async def test_webhook_posts_event_and_run_with_idempotency_key_and_hmac(store: EventStore) -> None:
    with WebhookServer() as srv:
        hook = _webhook("chat", srv.url, secret_env="HOOK_SECRET")
        async with Running(store, [hook], env={"HOOK_SECRET": "k3y"}):
            recorded = await _run(store, "aaaa00000001", ("RUNNING", "ERROR"))
            [outcome] = await _outcomes(store, 1)
        [got] = srv.received
    terminal = recorded[-1]
    assert got.path == "/hook/s3cr3t-path"
    assert got.headers["content-type"] == "application/json"
    assert got.headers["x-jobsup-event"] == str(terminal.seq)
    expected = "sha256=" + hmac.new(b"k3y", got.body, hashlib.sha256).hexdigest()
    assert got.headers["x-jobsup-signature"] == expected
    body = got.json
    assert body["event"] == terminal.to_json()
    run = body["run"]
    assert (run["id"], run["phase"], run["reason"], run["exit_code"], run["project"]) == (
        "aaaa00000001",
        "ERROR",
        "NonZeroExit",
        3,
        "proj",
    )
    assert run["command"] == "python train.py"
    # The outcome is an event of the run; the checkpoint moved with it.
    assert outcome.type == HOOK_DELIVERED and outcome.run_id == "aaaa00000001"
    assert outcome.data["hook"] == "chat" and outcome.data["event_seq"] == terminal.seq
    assert outcome.data["status"] == 200 and outcome.data["attempt"] == 1 and outcome.data["output"] == "ok"
    assert await store.get_checkpoint("hook:chat") == terminal.seq
    assert "s3cr3t-path" not in json.dumps(outcome.data)  # the URL is never recorded


async def test_no_signature_without_a_secret_and_only_wanted_phases(store: EventStore) -> None:
    with WebhookServer() as srv:
        hook = _webhook("running", srv.url, when=frozenset({"RUNNING"}))
        async with Running(store, [hook]):
            recorded = await _run(store, "aaaa00000001", ("STAGING", "RUNNING", "COMPLETED"))
            await _outcomes(store, 1)
            await anyio.sleep(0.3)
        [got] = srv.received
    assert "x-jobsup-signature" not in got.headers
    assert got.json["event"]["data"]["phase"] == "RUNNING"
    assert got.headers["x-jobsup-event"] == str(recorded[-2].seq)


async def test_match_filters_runs(store: EventStore) -> None:
    with WebhookServer() as srv:
        hook = _webhook("ml", srv.url, match={"project": ("ml-*",), "reason": ("NonZero*", "OOMKilled")})
        async with Running(store, [hook]):
            await _run(store, "aaaa00000001", ("ERROR",), project="ml-a")  # wanted
            await _run(store, "aaaa00000002", ("COMPLETED",), project="ml-a")  # reason None
            await _run(store, "aaaa00000003", ("ERROR",), project="web")  # project
            await _outcomes(store, 1)
            await anyio.sleep(0.5)
    assert [r.json["run"]["id"] for r in srv.received] == ["aaaa00000001"]


async def test_500_is_retried_until_200_with_the_same_event_key(store: EventStore) -> None:
    with WebhookServer() as srv:
        srv.replies = [Reply(500, body=b"boom"), Reply(503)]
        async with Running(store, [_webhook("chat", srv.url)]):
            recorded = await _run(store, "aaaa00000001")
            outcomes = await _outcomes(store, 3)
        got = srv.received
    assert [o.type for o in outcomes] == [HOOK_FAILED, HOOK_FAILED, HOOK_DELIVERED]
    assert [o.data["attempt"] for o in outcomes] == [1, 2, 3]
    assert [o.data["status"] for o in outcomes] == [500, 503, 200]
    assert outcomes[0].data["final"] is False and outcomes[0].data["retry_in_s"] == 1.0
    assert outcomes[0].data["error"] == "HTTP 500" and outcomes[0].data["output"] == "boom"
    assert outcomes[1].data["retry_in_s"] == 2.0
    assert {r.headers["x-jobsup-event"] for r in got} == {str(recorded[-1].seq)}
    assert len({r.body for r in got}) == 1
    assert got[1].at - got[0].at >= 0.9 and got[2].at - got[1].at >= 1.9  # the back-off was waited
    assert await store.get_checkpoint("hook:chat") == recorded[-1].seq


async def test_400_is_a_permanent_failure_and_the_hook_goes_on(store: EventStore) -> None:
    with WebhookServer() as srv:
        srv.replies = [Reply(400, body=b"bad payload")]
        async with Running(store, [_webhook("chat", srv.url)]):
            first = await _run(store, "aaaa00000001")
            second = await _run(store, "aaaa00000002")
            outcomes = await _outcomes(store, 2)
    assert [(o.type, o.run_id, o.data.get("final")) for o in outcomes] == [
        (HOOK_FAILED, "aaaa00000001", True),
        (HOOK_DELIVERED, "aaaa00000002", None),
    ]
    assert outcomes[0].data["status"] == 400 and outcomes[0].data["error"] == "HTTP 400"
    assert len(srv.received) == 2
    assert await store.get_checkpoint("hook:chat") == second[-1].seq > first[-1].seq


async def test_429_retry_after_is_honoured(store: EventStore) -> None:
    with WebhookServer() as srv:
        srv.replies = [Reply(429, headers={"Retry-After": "3"})]
        async with Running(store, [_webhook("chat", srv.url)]):
            await _run(store, "aaaa00000001")
            outcomes = await _outcomes(store, 2)
        got = srv.received
    assert [o.type for o in outcomes] == [HOOK_FAILED, HOOK_DELIVERED]
    assert outcomes[0].data["retry_in_s"] == 3.0  # not the 1 s back-off
    assert got[1].at - got[0].at >= 2.9


async def test_retrying_stops_after_retry_for_s(store: EventStore) -> None:
    with WebhookServer(default=Reply(502)) as srv:
        async with Running(store, [_webhook("chat", srv.url, retry_for_s=2.5)]):
            recorded = await _run(store, "aaaa00000001")
            outcomes = await _outcomes(store, 2)
            await anyio.sleep(0.3)
    # attempt 1 (+1 s), attempt 2 (+2 s would pass 2.5 s): gives up.
    assert [(o.data["attempt"], o.data["final"]) for o in outcomes] == [(1, False), (2, True)]
    assert "gave up" in outcomes[1].data["error"]
    assert len(srv.received) == 2
    assert await store.get_checkpoint("hook:chat") == recorded[-1].seq


async def test_connection_refused_is_retried(store: EventStore) -> None:
    with WebhookServer() as srv:
        url = srv.url
    # The server is gone: nothing listens on that port any more.
    async with Running(store, [_webhook("chat", url, retry_for_s=1.5)]):
        await _run(store, "aaaa00000001")
        outcomes = await _outcomes(store, 2)
    assert [o.data["final"] for o in outcomes] == [False, True]
    assert outcomes[0].data["status"] is None and "Connect" in outcomes[0].data["error"]
    assert "s3cr3t-path" not in outcomes[0].data["error"]


async def test_command_hook_gets_fields_env_and_last_50_lines(store: EventStore, tmp_path: Path) -> None:
    out = tmp_path / "out"
    script = (
        'printf "%s|%s|%s|%s|%s|%s|%s|%s\\n" "$JOBSUP_RUN_ID" "$JOBSUP_PHASE" "$JOBSUP_REASON" "$JOBSUP_EXIT_CODE"'
        ' "$JOBSUP_NAME" "$JOBSUP_PROJECT" "$JOBSUP_EVENT_SEQ" "${DAEMON_VAR:-}" > "$0"; cat >> "$0"; echo said-this; exit 3'
    )
    hook = HookSpec(name="cmd", when=TERMINAL, command=("sh", "-c", script, str(out)))
    async with Running(store, [hook], env={"PATH": "/usr/bin:/bin", "DAEMON_VAR": "from-daemon"}):
        recorded = await _run(store, "aaaa00000001", ("ERROR",))
        [outcome] = await _outcomes(store, 1)
    head, *stdin = out.read_text().splitlines()
    assert head == f"aaaa00000001|ERROR|NonZeroExit|3|train|proj|{recorded[-1].seq}|from-daemon"
    assert stdin == [f"line {i}" for i in range(10, 60)]  # the last 50 lines
    assert outcome.type == HOOK_FAILED
    assert (outcome.data["exit_code"], outcome.data["error"], outcome.data["final"]) == (3, "exit code 3", True)
    assert outcome.data["output"] == "said-this\n"
    assert await store.get_checkpoint("hook:cmd") == recorded[-1].seq


async def test_a_slow_hook_does_not_delay_another(store: EventStore, tmp_path: Path) -> None:
    release = threading.Event()
    with WebhookServer() as fast, WebhookServer(default=Reply(hold=release)) as slow:
        hooks = [_webhook("slow", slow.url, timeout_s=60), _webhook("fast", fast.url)]
        try:
            async with Running(store, hooks):
                for i in range(3):
                    await _run(store, f"aaaa0000000{i}")
                started = time.monotonic()
                await anyio.to_thread.run_sync(fast.wait_for, 3)
                assert time.monotonic() - started < 30  # not behind the held request
                assert len(slow.received) == 1  # in order per hook: still on the first event
                release.set()
                outcomes = await _outcomes(store, 6)
        finally:
            release.set()
    assert Counter(o.data["hook"] for o in outcomes) == {"slow": 3, "fast": 3}


async def test_a_new_hook_starts_at_the_end_of_the_log_unless_backfill(store: EventStore) -> None:
    old = [await _run(store, f"aaaa0000000{i}") for i in range(2)]
    with WebhookServer() as srv:
        hooks = [_webhook("new", srv.url + "/new"), _webhook("back", srv.url + "/back", backfill=True)]
        async with Running(store, hooks):
            newer = await _run(store, "bbbb00000001")
            await _outcomes(store, 4)
            await anyio.sleep(0.3)
    by_path = Counter(r.path.rsplit("/", 1)[1] for r in srv.received)
    assert by_path == {"new": 1, "back": 3}
    assert [r.json["run"]["id"] for r in srv.received if r.path.endswith("/new")] == ["bbbb00000001"]
    assert old and newer


async def test_restart_resumes_from_the_checkpoint(store: EventStore) -> None:
    with WebhookServer() as srv:
        async with Running(store, [_webhook("chat", srv.url)]):
            await _run(store, "aaaa00000001")
            await _outcomes(store, 1)
        # Stopped: events recorded meanwhile are delivered after a restart.
        await _run(store, "aaaa00000002")
        await _run(store, "aaaa00000003")
        async with Running(store, [_webhook("chat", srv.url)]):
            await _outcomes(store, 3)
    assert [r.json["run"]["id"] for r in srv.received] == ["aaaa00000001", "aaaa00000002", "aaaa00000003"]


@pytest.mark.slow
async def test_200_runs_ending_at_once_with_3_hooks_each_deliver_exactly_once(store: EventStore) -> None:
    n = 200
    with WebhookServer() as srv:
        hooks = [_webhook(f"h{i}", f"{srv.url}/h{i}") for i in range(3)]
        async with Running(store, hooks) as service:
            async with anyio.create_task_group() as tg:
                for i in range(n):
                    tg.start_soon(_run, store, f"{i:012x}")
            await _outcomes(store, 3 * n, timeout=90)
            # Then the checkpoints catch up with the end of the log.
            last = await store.last_seq()
            with anyio.fail_after(30):
                while set((await store.checkpoints()).values()) != {await store.last_seq()}:
                    await anyio.sleep(0.2)
            status = await service.status()
    keys = Counter((r.path, r.headers["x-jobsup-event"]) for r in srv.received)
    assert len(keys) == 3 * n and set(keys.values()) == {1}  # every delivery exactly once
    for i in range(3):  # in order per hook
        seqs = [int(r.headers["x-jobsup-event"]) for r in srv.received if r.path.endswith(f"/h{i}")]
        assert seqs == sorted(seqs) and len(seqs) == n
    assert last == await store.last_seq()  # nothing appended after the outcomes
    assert all(h["lag"] == 0 for h in status)


async def test_in_flight_window_starts_in_order_one_per_run_and_holds_the_checkpoint(store: EventStore) -> None:
    release = threading.Event()
    try:
        with WebhookServer(default=Reply(hold=release)) as srv:
            hook = _webhook("win", srv.url, timeout_s=60, when=frozenset({"RUNNING", "COMPLETED"}), in_flight=2)
            async with Running(store, [hook]):
                before = await store.last_seq()
                # Run 1 RUNNING and COMPLETED: its second event waits for its first.
                one = await _run(store, "aaaa00000001")
                two = await _run(store, "aaaa00000002")
                await anyio.to_thread.run_sync(srv.wait_for, 1)
                await anyio.sleep(0.5)
                # Two under way at most; run 1's COMPLETED does not start before
                # its RUNNING ended, and nothing later starts before it (in order).
                assert [int(r.headers["x-jobsup-event"]) for r in srv.received] == [one[-2].seq]
                assert await store.get_checkpoint("hook:win") == before
                release.set()
                outcomes = await _outcomes(store, 4)
                with anyio.fail_after(30):
                    while await store.get_checkpoint("hook:win") != two[-1].seq:
                        await anyio.sleep(0.1)
    finally:
        release.set()
    assert [o.type for o in outcomes] == [HOOK_DELIVERED] * 4
    seqs = [int(r.headers["x-jobsup-event"]) for r in srv.received]
    assert sorted(seqs) == [one[-2].seq, one[-1].seq, two[-2].seq, two[-1].seq]
    for run in (one, two):  # a receiver sees each run's events in order
        mine = [s for s in seqs if s in (run[-2].seq, run[-1].seq)]
        assert mine == sorted(mine)


async def test_in_flight_window_runs_different_runs_at_once(store: EventStore) -> None:
    release = threading.Event()
    try:
        with WebhookServer(default=Reply(hold=release)) as srv:
            hook = _webhook("win", srv.url, timeout_s=60, in_flight=2)
            async with Running(store, [hook]):
                before = await store.last_seq()
                runs = [await _run(store, f"aaaa0000000{i}") for i in range(3)]
                await anyio.to_thread.run_sync(srv.wait_for, 2)
                await anyio.sleep(0.5)
                started = [int(r.headers["x-jobsup-event"]) for r in srv.received]
                assert sorted(started) == [runs[0][-1].seq, runs[1][-1].seq]  # the window: two, the first two
                assert await store.get_checkpoint("hook:win") == before  # not past an event under way
                release.set()
                await _outcomes(store, 3)
                with anyio.fail_after(30):
                    while await store.get_checkpoint("hook:win") != runs[2][-1].seq:
                        await anyio.sleep(0.1)
    finally:
        release.set()
    assert len(srv.received) == 3


async def test_after_a_restart_events_with_a_final_outcome_are_not_delivered_again(store: EventStore) -> None:
    with WebhookServer() as srv:
        async with Running(store, [_webhook("chat", srv.url)]):
            pass
        checkpoint = await store.get_checkpoint("hook:chat")
        first = await _run(store, "aaaa00000001")
        second = await _run(store, "aaaa00000002")
        # As a window leaves it after kill -9: the second event's outcome is
        # recorded, the first one's is not (the checkpoint is before both).
        data = {"hook": "chat", "kind": "webhook", "event_seq": second[-1].seq, "phase": "COMPLETED",
                "attempt": 1, "duration_s": 0.01, "status": 200}  # fmt: skip
        await store.append("aaaa00000002", None, [NewEvent(HOOK_DELIVERED, data)])
        failed = {**data, "event_seq": first[-1].seq, "status": 503, "error": "HTTP 503", "final": False}
        await store.append("aaaa00000001", None, [NewEvent(HOOK_FAILED, failed)])
        assert await store.get_checkpoint("hook:chat") == checkpoint
        async with Running(store, [_webhook("chat", srv.url)]):
            outcomes = await _outcomes(store, 3)
            with anyio.fail_after(30):
                while await store.get_checkpoint("hook:chat") != await store.last_seq():
                    await anyio.sleep(0.1)
    assert [r.json["run"]["id"] for r in srv.received] == ["aaaa00000001"]
    assert outcomes[-1].data["event_seq"] == first[-1].seq and outcomes[-1].data["attempt"] == 2


async def test_a_url_behind_an_environment_proxy_goes_through_the_proxy(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("https_proxy", "all_proxy", "no_proxy", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "HTTP_PROXY"):
        monkeypatch.delenv(name, raising=False)
    with WebhookServer() as proxy:
        monkeypatch.setenv("http_proxy", proxy.url.rsplit("/hook", 1)[0])
        async with Running(store, [_webhook("chat", "http://hooks.example.invalid/in")]):
            await _run(store, "aaaa00000001")
            [outcome] = await _outcomes(store, 1)
    assert outcome.type == HOOK_DELIVERED
    assert [r.path for r in proxy.received] == ["http://hooks.example.invalid/in"]  # absolute form: a proxy request


async def test_an_outcome_the_store_failed_to_record_is_recorded_later_and_only_once(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first group of outcomes: the first one's append fails (storage
    # trouble), the others are recorded. The failed one is appended again
    # after a pause; the delivered events are not delivered again.
    real = store.append_many
    calls: list[int] = []

    async def flaky(appends: Sequence[Append]) -> list[list[RecordedEvent] | StoreError]:
        calls.append(len(appends))
        if len(calls) > 1:
            return await real(appends)
        rest = await real(appends[1:])
        return [StoreLockedError("jobsup.db: locked by another process"), *rest]

    monkeypatch.setattr(store, "append_many", flaky)
    with WebhookServer() as srv:
        async with Running(store, [_webhook("chat", srv.url)]):
            async with anyio.create_task_group() as tg:
                for i in range(3):
                    tg.start_soon(_run, store, f"bbbb0000000{i}")
            outcomes = await _outcomes(store, 3)
            with anyio.fail_after(30):  # the checkpoint then passes every delivered event
                while (await store.checkpoints())["hook:chat"] < max(e.data["event_seq"] for e in outcomes):
                    await anyio.sleep(0.1)
        assert len(srv.received) == 3  # each event delivered once
    assert sorted(e.data["event_seq"] for e in outcomes) == sorted(
        int(r.headers["x-jobsup-event"]) for r in srv.received
    )
    assert len(outcomes) == 3 and {e.type for e in outcomes} == {HOOK_DELIVERED}
    assert len(calls) >= 2 and calls[1] == 1  # the failed outcome alone, again


async def test_a_phase_change_another_process_appended_is_not_passed_over(store: EventStore, tmp_path: Path) -> None:
    # Another process (here: another EventStore on the same file) appends a
    # terminal phase change while the hook waits to flush its checkpoint
    # over events it does not want. This store publishes that event only at
    # its next commit; until then the hook must not move past it (it used
    # to take the file's last seq as the end of what it had looked at).
    with WebhookServer() as srv:
        async with Running(store, [_webhook("chat", srv.url)]):
            await _run(store, "dddd00000001", phases=("RUNNING",))  # not wanted: a timed wait follows
            async with await EventStore.open(tmp_path / "jobsup.db", synchronous="NORMAL") as other:
                await _run(other, "dddd00000002")
            await anyio.sleep(2 * FLUSH_S + 1.0)  # the hook's idle flushes come and go
            await _run(store, "dddd00000003")  # a local commit publishes (and shows the gap)
            await _outcomes(store, 2, timeout=15)
    assert sorted(r.json["run"]["id"] for r in srv.received) == ["dddd00000002", "dddd00000003"]


@pytest.mark.parametrize(("max_s", "transactions"), [(60.0, 1), (0.5, 2)])
async def test_a_bursts_outcomes_are_appended_together_once_it_pauses_or_at_the_cap(
    store: EventStore, monkeypatch: pytest.MonkeyPatch, max_s: float, transactions: int
) -> None:
    # Outcomes come every ~0.2 s (the server's pace), less than the quiet
    # gap (1 s): the recorder keeps gathering them and appends them in one
    # transaction once the burst paused, although the burst lasts longer
    # than the gap (a window fixed from the first outcome used to cut it);
    # with a cap of 0.5 s they are appended in at least two.
    monkeypatch.setattr(delivery, "_GATHER_S", 1.0)
    monkeypatch.setattr(delivery, "_GATHER_MAX_S", max_s)
    n = 8
    with WebhookServer() as srv:
        srv.on_request = lambda _: time.sleep(0.2)
        async with Running(store, [_webhook("chat", srv.url)]):
            async with anyio.create_task_group() as tg:
                for i in range(n):
                    tg.start_soon(_run, store, f"eeee{i:08d}")
            outcomes = await _outcomes(store, n)
    assert [e.data["event_seq"] for e in outcomes] == sorted(int(r.headers["x-jobsup-event"]) for r in srv.received)
    ats = {e.at for e in outcomes}  # an event's `at` is when its transaction began
    assert len(ats) == 1 if transactions == 1 else len(ats) >= transactions


async def test_the_hooks_of_a_service_read_a_runs_submitted_data_once(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two webhooks and the on-done hook wake for the same phase changes:
    # one read of each run's Submitted event serves them all.
    read: Counter[str] = Counter()
    real = store.first_events

    async def counting(run_ids: Collection[str]) -> dict[str, RecordedEvent]:
        read.update(run_ids)
        return await real(run_ids)

    monkeypatch.setattr(store, "first_events", counting)
    n = 20
    with WebhookServer() as srv:
        async with Running(store, [_webhook("a", f"{srv.url}/a"), _webhook("b", f"{srv.url}/b")]):
            async with anyio.create_task_group() as tg:
                for i in range(n):
                    tg.start_soon(_run, store, f"ffff{i:08d}")
            await _outcomes(store, 2 * n)
    assert len(srv.received) == 2 * n
    assert {r.json["run"]["command"] for r in srv.received} == {"python train.py"}  # from the Submitted data
    assert set(read) == {f"ffff{i:08d}" for i in range(n)} and set(read.values()) == {1}


async def test_an_idle_hooks_checkpoint_follows_the_events_it_does_not_want(store: EventStore) -> None:
    """A hook caught up with the log still passes over the events appended
    after that (output records, other hooks' outcomes, other runs' lines):
    its lag goes back to 0 (it stayed at the count of those events)."""
    with WebhookServer() as srv:
        async with Running(store, [_webhook("a", srv.url + "/a"), _webhook("b", srv.url + "/b")]) as service:
            await _run(store, "aaaa00000001")
            await _outcomes(store, 2)
            for i in range(3):  # after the hooks caught up: events none of them wants
                with anyio.fail_after(8 * FLUSH_S):
                    while set((await store.checkpoints()).values()) != {await store.last_seq()}:
                        await anyio.sleep(0.05)
                await store.append(
                    "aaaa00000001",
                    None,
                    [NewEvent("LogLines", {"stream": "stdout", "source": "stdout", "lines": [[str(100 + i), "more"]]})],
                )
            with anyio.fail_after(8 * FLUSH_S):
                while {h["lag"] for h in await service.status()} != {0}:
                    await anyio.sleep(0.05)
