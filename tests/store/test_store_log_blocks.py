"""Log blocks: the same output fed through reads of random sizes, replays
from random earlier positions and both append forms is stored byte-identical
to what :func:`store.split_lines` makes of the whole output at once."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from store_helpers import lines, submitted

from store import MAX_LINE_BYTES, EventStore, LogBlock, split_block, split_lines
from store.logblocks import lines_after, skip_lines, skip_offset

pytestmark = pytest.mark.anyio


def _random_output(rng: random.Random, n_lines: int) -> bytes:
    parts = []
    for _ in range(n_lines):
        kind = rng.random()
        if kind < 0.75:
            parts.append(b"line %d %s\n" % (rng.randrange(10**6), b"x" * rng.randrange(0, 120)))
        elif kind < 0.83:
            parts.append("é€𝄞 ünïcode %d\n".format().encode() % rng.randrange(100))
        elif kind < 0.88:
            parts.append(b"crlf line\r\n")
        elif kind < 0.92:
            parts.append(b"bad \xff\xfe utf8 \xe2\x82\n")
        elif kind < 0.95:
            parts.append(b"\n")
        elif kind < 0.97:
            parts.append(b"L" * rng.randrange(MAX_LINE_BYTES - 5, 3 * MAX_LINE_BYTES) + b"\n")
        else:
            parts.append(("€" * rng.randrange(20000, 40000)).encode() + b"\n")  # long multi-byte lines
    if rng.random() < 0.5:
        parts.append(b"no newline at the end")
    return b"".join(parts)


def _expected(data: bytes) -> tuple[bytes, list[str]]:
    ref, consumed = split_lines(data, 0, final=True)
    assert consumed == len(data)
    return "".join(t + "\n" for _, t in ref).encode(), [p for p, _ in ref]


@pytest.mark.parametrize("seed", range(3))
async def test_random_reads_and_replays_store_the_text_exactly_once(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    data = _random_output(rng, 3000)
    expected_text, expected_positions = _expected(data)
    async with await EventStore.open(tmp_path / "jobsup.db", synchronous="OFF") as store:
        [sub] = await store.append("r1", 0, [submitted()])
        version = sub.version
        written = 0  # how much of the output the job has written so far
        offset = 0  # the tailer's read offset
        recorded: list[int] = [0]  # positions recorded so far (where a reconnect may resume)
        while True:
            written = min(len(data), written + rng.randrange(1, 300_000))
            final = written == len(data)
            while True:
                buf = data[offset : min(written, offset + rng.randrange(1, 500_000))]
                at_eof = offset + len(buf) == written
                block, consumed = split_block(buf, offset, final and at_eof, "stdout", "stdout")
                if block is None:
                    break
                if rng.random() < 0.3:  # the per-line form of the same lines (as Kubernetes sends them)
                    pairs, consumed = split_lines(buf, offset, final and at_eof)
                    [event] = await store.append("r1", version, [lines(pairs)])
                else:
                    [event] = await store.append_log("r1", version, [block])
                version = event.version
                offset += consumed
                if event.data["line_count"]:
                    recorded.append(int(event.data["last_pos"]))
                if rng.random() < 0.15:  # a reconnect: read again from an earlier recorded position
                    offset = rng.choice(recorded)
                if at_eof:
                    break
            if final and offset == len(data):
                break
        last, text = await store.log_text("r1", 0, max_blocks=10**6)
        assert text == expected_text
        assert last == len(expected_positions)
        got = await store.log_lines("r1", limit=10**6)
        assert [ln.pos for ln in got] == expected_positions
        assert [ln.line_no for ln in got] == list(range(1, len(expected_positions) + 1))
        assert "".join(ln.text + "\n" for ln in got).encode() == expected_text
        run = await store.get_run("r1")
        assert run is not None and run.log_lines == len(expected_positions)
        # paging from anywhere inside a block gives the same lines
        for _ in range(20):
            after = rng.randrange(0, len(expected_positions) + 1)
            last, part = await store.log_text("r1", after, max_blocks=10**6)
            assert part == "".join(ln.text + "\n" for ln in got[after:]).encode()


async def test_a_replayed_block_is_trimmed_at_the_newest_position(store: EventStore) -> None:
    await store.append("r1", 0, [submitted()])
    data = b"aa\nbbb\ncccc\n"
    [e1] = await store.append_log("r1", 1, [LogBlock("stdout", "stdout", data[:7], start=0)])
    assert (e1.data["first_line"], e1.data["line_count"], e1.data["first_pos"], e1.data["last_pos"]) == (1, 2, "3", "7")
    # the whole range again: only "cccc" is new
    [e2] = await store.append_log("r1", 2, [LogBlock("stdout", "stdout", data, start=0)])
    assert (e2.data["first_line"], e2.data["line_count"], e2.data["replayed"], e2.data["first_pos"]) == (3, 1, 2, "12")
    # nothing new at all: an audit record of the replay, no line
    [e3] = await store.append_log("r1", 3, [LogBlock("stdout", "stdout", data[3:], start=3)])
    assert (e3.data["line_count"], e3.data["replayed"]) == (0, 2)
    assert [ln.text for ln in await store.log_lines("r1")] == ["aa", "bbb", "cccc"]
    assert await store.last_log_position("r1", "stdout") == "12"
    assert e2.data["sha256"].startswith("sha256:") and e2.data["bytes"] == 5


async def test_malformed_blocks_are_refused(store: EventStore) -> None:
    await store.append("r1", 0, [submitted()])
    with pytest.raises(ValueError, match="ending with a newline"):
        await store.append_log("r1", 1, [LogBlock("stdout", "stdout", b"no newline", start=0)])
    with pytest.raises(ValueError, match="exactly one of start and positions"):
        await store.append_log("r1", 1, [LogBlock("stdout", "stdout", b"a\n")])
    with pytest.raises(ValueError, match="2 lines but 1 positions"):
        await store.append_log("r1", 1, [LogBlock("stdout", "stdout", b"a\nb\n", positions=("1",))])
    with pytest.raises(ValueError, match="must not hold a newline"):
        await store.append("r1", 1, [lines([("1", "two\nlines")])])
    assert (await store.get_run("r1")).version == 1  # type: ignore[union-attr]


def _naive_skip(text: bytes, n: int) -> tuple[int, int]:
    """The reference for skip_offset: one newline at a time."""
    at = skipped = 0
    while skipped < n:
        nl = text.find(b"\n", at)
        if nl < 0:
            break
        at, skipped = nl + 1, skipped + 1
    return at, skipped


@pytest.mark.parametrize("seed", range(4))
def test_skipping_lines_by_window_matches_a_newline_at_a_time(seed: int) -> None:
    """skip_offset / skip_lines / lines_after (the paging behind ``logs
    --tail`` and ``after_line``) agree with a one-newline-at-a-time scan on
    texts whose lines straddle the 64 KiB windows, including empty lines,
    a text of only newlines and asking for more lines than there are."""
    rng = random.Random(seed)
    texts = [b"", b"\n" * 70_000, b"x" * 200_000 + b"\n"]
    for _ in range(6):
        texts.append(b"".join(b"y" * rng.choice([0, 1, 79, 5000, 70_000]) + b"\n" for _ in range(rng.randint(1, 400))))
    for text in texts:
        total = text.count(b"\n")
        for n in {0, 1, 2, total // 2, total - 1, total, total + 5, *(rng.randint(0, total + 2) for _ in range(20))}:
            if n < 0:
                continue
            assert skip_offset(text, n) == _naive_skip(text, n), (len(text), n)
            assert skip_lines(text, n) == text[_naive_skip(text, n)[0] :]
            assert lines_after(text, n, total) == text[_naive_skip(text, n)[0] :]


async def test_blocks_of_many_runs_in_one_batch_are_trimmed_as_one_by_one(store: EventStore) -> None:
    """A batch holding the blocks of several runs reads their last lines and
    newest positions in two queries (BlockResolver.prefetch): the lines kept
    and their numbers are those of one append at a time."""
    import anyio

    data = b"aa\nbbb\ncccc\n"
    runs = ["r1", "r2", "r3", "r4"]
    for run_id in runs:
        await store.append(run_id, 0, [submitted()])
    for run_id in runs[:3]:  # r4 has no line yet
        await store.append_log(run_id, 1, [LogBlock("stdout", "stdout", data[: 3 + 4 * (run_id == "r2")], start=0)])
    got: dict[str, list[object]] = {}

    async def replay(run_id: str) -> None:
        version = 1 if run_id == "r4" else 2
        blocks = [LogBlock("stdout", "stdout", data, start=0), LogBlock("stderr", "stderr", b"e\n", start=0)]
        got[run_id] = [
            (e.data["first_line"], e.data["line_count"]) for e in await store.append_log(run_id, version, blocks)
        ]

    transactions = store.statistics().transactions
    async with anyio.create_task_group() as tg:
        for run_id in runs:
            tg.start_soon(replay, run_id)
    assert store.statistics().transactions - transactions < len(runs)  # some shared a batch
    assert got == {"r1": [(2, 2), (4, 1)], "r2": [(3, 1), (4, 1)], "r3": [(2, 2), (4, 1)], "r4": [(1, 3), (4, 1)]}
    for run_id in runs:
        assert [ln.text for ln in await store.log_lines(run_id)] == ["aa", "bbb", "cccc", "e"]
        assert await store.last_log_position(run_id, "stdout") == "12"
