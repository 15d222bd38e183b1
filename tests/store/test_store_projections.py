"""Projections (run status, log lines) and rebuild equivalence."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Any

import anyio
import pytest
from store_helpers import handle, lines, phase, snapshot, submitted

from store import EventStore, LogLine, NewEvent, RecordedEvent, RunStatus

pytestmark = pytest.mark.anyio


async def test_run_status_follows_the_lifecycle(store: EventStore) -> None:
    [sub] = await store.append("abc123def456", 0, [submitted(project="vision", name="train", backend="kubernetes")])
    run = await store.get_run("abc123def456")
    assert run == RunStatus(
        id="abc123def456", project="vision", name="train", backend="kubernetes", phase="QUEUED",
        reason=None, message=None, exit_code=None, created_at=sub.at, updated_at=sub.at,
        last_seq=1, version=1, handle={}, log_lines=0,
    )  # fmt: skip
    assert not run.terminal

    await store.append("abc123def456", 1, [phase("RUNNING", reason="Started", message="pod is running")])
    await store.append("abc123def456", 2, [handle(namespace="ml", job="jobsup-abc123def456")])
    await store.append("abc123def456", 3, [phase("ERROR", reason="NonZeroExit", exit_code=3)])
    [last] = await store.append("abc123def456", 4, [NewEvent("CancelRequested", {"by": "user"})])

    run = await store.get_run("abc123def456")
    assert run is not None
    assert (run.phase, run.reason, run.message, run.exit_code) == ("ERROR", "NonZeroExit", None, 3)
    assert run.handle == {"namespace": "ml", "job": "jobsup-abc123def456"}
    assert (run.created_at, run.updated_at, run.last_seq, run.version) == (sub.at, last.at, 5, 5)
    assert run.terminal
    assert run.to_json()["handle"] == run.handle
    assert await store.get_run("nope") is None


async def test_events_before_submitted_create_no_run(store: EventStore) -> None:
    await store.append("r1", 0, [phase("RUNNING"), lines([("1", "early")])])
    assert await store.get_run("r1") is None
    assert [ln.text for ln in await store.log_lines("r1")] == ["early"]
    await store.append("r1", 2, [submitted()])
    run = await store.get_run("r1")
    assert run is not None and run.phase == "QUEUED" and run.log_lines == 1 and run.version == 3


async def test_log_lines_are_numbered_and_deduplicated_by_source_position(store: EventStore) -> None:
    await store.append("r1", 0, [submitted()])
    await store.append("r1", 1, [lines([("4", "a"), ("8", "b"), ("8", "b again in the same event")])])
    # a replay after a reconnect: two known positions, one new
    await store.append("r1", 2, [lines([("4", "a"), ("8", "b"), ("12", "c")])])
    # the same position from another source is another line
    await store.append("r1", 3, [lines([("4", "err"), ("9", "err2")], stream="stderr", source="stderr")])
    # an event of only duplicates adds nothing
    await store.append("r1", 4, [lines([("12", "c")])])

    got = await store.log_lines("r1")
    assert [(ln.line_no, ln.stream, ln.source, ln.pos, ln.text, ln.seq) for ln in got] == [
        (1, "stdout", "stdout", "4", "a", 2),
        (2, "stdout", "stdout", "8", "b", 2),
        (3, "stdout", "stdout", "12", "c", 3),
        (4, "stderr", "stderr", "4", "err", 4),
        (5, "stderr", "stderr", "9", "err2", 4),
    ]
    run = await store.get_run("r1")
    assert run is not None and run.log_lines == 5 and run.version == 5
    assert await store.last_log_position("r1", "stdout") == "12"
    assert await store.last_log_position("r1", "stderr") == "9"
    assert await store.last_log_position("r1", "pod/main") is None
    assert await store.last_log_position("r2", "stdout") is None


async def test_log_line_paging_and_tail(store: EventStore) -> None:
    await store.append("r1", 0, [submitted(), lines([(str(i), f"line {i}") for i in range(1, 26)])])
    assert [ln.line_no for ln in await store.log_lines("r1", after_line=20)] == [21, 22, 23, 24, 25]
    assert [ln.line_no for ln in await store.log_lines("r1", after_line=5, limit=3)] == [6, 7, 8]
    assert await store.tail_line_no("r1", 10) == 15
    assert await store.tail_line_no("r1", 100) == 0
    assert await store.tail_line_no("r1", 0) == 25
    assert await store.tail_line_no("unknown", 10) == 0
    assert (await store.log_lines("r1", after_line=await store.tail_line_no("r1", 2)))[0].text == "line 24"


async def test_list_runs_filters_newest_first(store: EventStore) -> None:
    await store.append("aaaa0001", 0, [submitted(project="p1", name="train")])
    await store.append("aaab0002", 0, [submitted(project="p1", name="eval")])
    await store.append("bbbb0003", 0, [submitted(project="p2", name="train")])
    await store.append("aaaa0001", 1, [phase("COMPLETED", exit_code=0)])
    await store.append("bbbb0003", 1, [phase("RUNNING")])

    assert [r.id for r in await store.list_runs()] == ["bbbb0003", "aaab0002", "aaaa0001"]
    assert [r.id for r in await store.list_runs(project="p1")] == ["aaab0002", "aaaa0001"]
    assert [r.id for r in await store.list_runs(non_terminal_only=True)] == ["bbbb0003", "aaab0002"]
    assert [r.id for r in await store.list_runs(phases={"RUNNING", "COMPLETED"})] == ["bbbb0003", "aaaa0001"]
    assert [r.id for r in await store.list_runs(project="p1", name="train")] == ["aaaa0001"]
    assert await store.list_runs(phases=[]) == []

    assert await store.match_run_ids("aaa") == ["aaaa0001", "aaab0002"]
    assert await store.match_run_ids("aaaa") == ["aaaa0001"]
    assert await store.match_run_ids("aa", limit=1) == ["aaaa0001"]
    assert await store.match_run_ids("c") == []
    assert await store.match_run_ids("") == ["aaaa0001", "aaab0002", "bbbb0003"]


# -- randomized history: incremental == reference model == rebuilt --------------------


@dataclasses.dataclass
class Model:
    """An independent, obvious fold of the event log (the rules in store.types)."""

    runs: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    lines: dict[str, list[LogLine]] = dataclasses.field(default_factory=dict)
    newest: dict[tuple[str, str], str] = dataclasses.field(default_factory=dict)
    offered: int = 0

    def apply(self, e: RecordedEvent, sent: dict[tuple[str, int], dict[str, Any]]) -> None:
        """Fold ``e``; ``sent[(run, version)]`` is the data a LogLines event
        was appended with (its recorded data holds no text). Positions are
        byte offsets: a line is new when past the source's newest one."""
        run_lines = self.lines.setdefault(e.run_id, [])
        if e.type == "LogLines":
            data = sent[(e.run_id, e.version)]
            for pos, text in data["lines"]:
                self.offered += 1
                newest = self.newest.get((e.run_id, data["source"]))
                if newest is None or int(pos) > int(newest):
                    run_lines.append(
                        LogLine(e.run_id, len(run_lines) + 1, data["stream"], data["source"], pos, text, e.seq)
                    )
                    self.newest[(e.run_id, data["source"])] = pos
        run = self.runs.get(e.run_id)
        if e.type == "Submitted":
            if run is None:
                run = self.runs[e.run_id] = {
                    "id": e.run_id, "phase": "QUEUED", "reason": None, "message": None, "exit_code": None,
                    "created_at": e.at, "handle": {},
                }  # fmt: skip
            run.update(project=e.data["project"], name=e.data["name"], backend=e.data["backend"])
        if run is None:
            return
        if e.type == "PhaseChanged":
            run.update(
                phase=e.data["phase"],
                reason=e.data.get("reason"),
                message=e.data.get("message"),
                exit_code=e.data.get("exit_code"),
            )
        elif e.type == "HandleRecorded":
            run["handle"] = e.data["handle"]
        run.update(updated_at=e.at, last_seq=e.seq, version=e.version, log_lines=len(run_lines))


def _random_events(rng: random.Random, run_id: str, version: int, sent: dict[tuple[str, str], int]) -> list[NewEvent]:
    """1-3 random events; log lines mostly new, sometimes replayed (``sent``
    remembers how many lines each (run, source) has sent)."""
    out = []
    for _ in range(rng.randint(1, 3)):
        kind = rng.random()
        if kind < 0.55:
            source = rng.choice(["stdout", "stderr", "pod/main"])
            stream = "stderr" if source == "stderr" else "stdout"
            so_far = sent.get((run_id, source), 0)
            first = so_far
            if so_far and rng.random() < 0.04:  # a replay after a reconnect: some lines again
                first = rng.randint(max(0, so_far - 10), so_far - 1)
            count = rng.randint(0, 12)
            sent[(run_id, source)] = max(so_far, first + count)
            pairs = [
                (
                    str(n * 7),
                    f'{run_id} {n} {rng.random():.6f} é\ufffd\t"\\ 😀' + ("\x00nul" if rng.random() < 0.01 else ""),
                )
                for n in range(first, first + count)
            ]
            if pairs and rng.random() < 0.02:
                pairs.append(pairs[0])  # the same position twice in one event
            out.append(lines(pairs, stream=stream, source=source))
        elif kind < 0.75:
            out.append(
                phase(
                    rng.choice(["SCHEDULING", "STAGING", "RUNNING", "COMPLETED", "ERROR"]),
                    reason=rng.choice([None, "NonZeroExit", "OOMKilled"]),
                    message=rng.choice([None, "msg"]),
                    exit_code=rng.choice([None, 0, 1, 137]),
                )
            )
        elif kind < 0.85:
            out.append(handle(pid=rng.randint(1, 99999), started=rng.random()))
        elif kind < 0.9:
            out.append(submitted(project=rng.choice(["a", "b"]), name=f"n{rng.randint(0, 3)}"))
        else:
            out.append(NewEvent(rng.choice(["CancelRequested", "StagingStep", "ObjectCreated"]), {"v": version}))
    return out


async def test_randomized_history_rebuild_equals_incremental_and_the_model(db_path: Path) -> None:
    rng = random.Random(20261129)
    n_runs, n_events = 300, 4000
    run_ids = [f"{rng.getrandbits(48):012x}" for _ in range(n_runs)]
    # most runs start with Submitted; some never do (events without a run row)
    versions = dict.fromkeys(run_ids, 0)
    budget = [n_events]
    sent: dict[tuple[str, str], int] = {}
    appended: dict[tuple[str, int], dict[str, Any]] = {}

    async with await EventStore.open(db_path, synchronous="OFF", commit_window_s=0.001) as store:

        async def worker(mine: list[str], seed: int) -> None:
            wrng = random.Random(seed)
            for run_id in mine:
                if wrng.random() < 0.9:
                    versions[run_id] = (await store.append(run_id, 0, [submitted()]))[-1].version
                    budget[0] -= 1
            while budget[0] > 0:
                run_id = wrng.choice(mine)
                events = _random_events(wrng, run_id, versions[run_id], sent)
                budget[0] -= len(events)
                recorded = await store.append(run_id, versions[run_id], events)
                for new, rec in zip(events, recorded):
                    appended[(run_id, rec.version)] = new.data
                versions[run_id] = recorded[-1].version
                if wrng.random() < 0.3:
                    await anyio.sleep(0)

        async with anyio.create_task_group() as tg:
            for w in range(20):
                tg.start_soon(worker, run_ids[w::20], rng.getrandbits(32))

        log: list[RecordedEvent] = []
        while page := await store.read_all(after_seq=log[-1].seq if log else 0, limit=1000):
            log.extend(page)
        assert len(log) >= n_events and len({e.run_id for e in log}) == n_runs
        assert store.statistics().transactions < len(log) / 2  # batches mixed many runs
        model = Model()
        for event in log:
            model.apply(event, appended)
        assert sum(len(v) for v in model.lines.values()) > 1000
        assert sum(len(v) for v in model.lines.values()) < model.offered  # duplicates

        async def check_against_model() -> None:
            for run_id in run_ids:
                run = await store.get_run(run_id)
                expected = model.runs.get(run_id)
                assert (run is None) == (expected is None)
                if run is not None:
                    assert expected is not None
                    got = run.to_json()
                    assert {k: got[k] for k in expected} == expected
                expected_lines = model.lines.get(run_id, [])
                assert await store.log_lines(run_id) == expected_lines
                if run_id in run_ids[:20]:  # paging, starting anywhere within a block
                    paged, after = [], 0
                    while page := await store.log_lines(run_id, after_line=after, limit=3):
                        paged += page
                        after = page[-1].line_no
                    assert paged == expected_lines
                    if expected_lines:
                        n = len(expected_lines) // 2 + 1
                        tail = await store.log_lines(run_id, after_line=await store.tail_line_no(run_id, n))
                        assert tail == expected_lines[-n:]
                for source in ("stdout", "stderr", "pod/main"):
                    assert await store.last_log_position(run_id, source) == model.newest.get((run_id, source))

        await check_against_model()
        incremental = snapshot(db_path)
        await store.rebuild()
        assert snapshot(db_path) == incremental
        await check_against_model()
