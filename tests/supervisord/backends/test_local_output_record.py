"""The local output record: ``RecordTailer`` turns the
runner's ``output.log`` + ``output.idx`` into blocks in the order the runner
received the output, each line under its stream, exactly once across any
resume (what a daemon restart does), whatever the read sizes."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from store import split_lines
from supervisord.daemon.backends.local.runner import INDEX_ENTRY, OUTPUT_DATA, OUTPUT_INDEX, STDERR, STDOUT
from supervisord.daemon.backends.local.tail import MAX_BLOCKS, RecordTailer, record_source

Line = tuple[str, int, str]  # stream, position, text


def write_record(run_dir: Path, writes: list[tuple[str, bytes]]) -> None:
    """The files the runner writes for these reads (``(stream, bytes)`` in order)."""
    data, index, last = b"", b"", None
    for stream, chunk in writes:
        if stream != last:
            index += len(data).to_bytes(7, "big") + bytes((STDOUT if stream == "stdout" else STDERR,))
            last = stream
        data += chunk
    (run_dir / OUTPUT_DATA).write_bytes(data)
    (run_dir / OUTPUT_INDEX).write_bytes(index)
    assert len(index) % INDEX_ENTRY == 0


def block_lines(block: object) -> list[tuple[int, str]]:
    text = block.text  # type: ignore[attr-defined]
    pieces = text.split(b"\n")[:-1]
    if block.positions is not None:  # type: ignore[attr-defined]
        return [(int(p), t.decode()) for p, t in zip(block.positions, pieces, strict=True)]  # type: ignore[attr-defined]
    out, at = [], block.start  # type: ignore[attr-defined]
    for t in pieces:
        at += len(t) + 1
        out.append((at, t.decode()))
    return out


class Store:
    """What the store keeps of appended blocks: per source, only lines past its newest position."""

    def __init__(self) -> None:
        self.lines: list[Line] = []
        self.newest: dict[str, int] = {}

    def append(self, blocks: list[object]) -> None:
        for block in blocks:
            source = block.source  # type: ignore[attr-defined]
            assert source == record_source(block.stream)  # type: ignore[attr-defined]
            for pos, text in block_lines(block):
                if pos > self.newest.get(source, -1):
                    self.lines.append((block.stream, pos, text))  # type: ignore[attr-defined]
                    self.newest[source] = pos

    def positions(self) -> dict[str, int | None]:
        return {s: self.newest.get(record_source(s)) for s in ("stdout", "stderr")}


def ingest(run_dir: Path, store: Store, *, final: bool, max_bytes: int, stop_after: int | None = None) -> bool:
    """Read with a fresh tailer (a daemon start) until nothing is new, or
    until ``stop_after`` steps (a daemon killed). Returns True if stopped."""
    tailer = RecordTailer(run_dir, store.positions())
    steps = 0
    try:
        while True:
            items = tailer.read_blocks(final=final, max_bytes=max_bytes)
            if not items:
                return False
            store.append([b for b, _ in items])
            steps += 1
            if stop_after is not None and steps >= stop_after:
                return True
    finally:
        tailer.close()


def reference(writes: list[tuple[str, bytes]]) -> dict[str, list[tuple[int, str]]]:
    """Each stream's lines as split_lines splits that stream's own bytes, at their record offsets."""
    out: dict[str, list[tuple[int, str]]] = {}
    offsets: dict[str, list[int]] = {"stdout": [], "stderr": []}
    streams: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
    at = 0
    for stream, chunk in writes:
        offsets[stream].extend(range(at, at + len(chunk)))
        streams[stream] += chunk
        at += len(chunk)
    for stream, data in streams.items():
        lines, _ = split_lines(bytes(data), 0, True)
        out[stream] = [(offsets[stream][int(p) - 1] + 1, t) for p, t in lines]
    return out


def test_lines_come_in_the_order_received_with_their_stream(tmp_path: Path) -> None:
    writes = [("stdout", b"out 1\n"), ("stderr", b"err 1\n"), ("stdout", b"out 2\nout 3\n"), ("stderr", b"err 2\n")]
    write_record(tmp_path, writes)
    store = Store()
    ingest(tmp_path, store, final=True, max_bytes=1 << 20)
    assert [(s, t) for s, _, t in store.lines] == [
        ("stdout", "out 1"), ("stderr", "err 1"), ("stdout", "out 2"), ("stdout", "out 3"), ("stderr", "err 2"),
    ]  # fmt: skip
    assert [p for _, p, _ in store.lines] == [6, 12, 18, 24, 30]  # offsets in output.log


def test_a_line_interrupted_by_the_other_stream_keeps_its_text_and_true_position(tmp_path: Path) -> None:
    # stdout "abc" arrives in two reads around a stderr line; then a partial last line at exit.
    writes = [("stdout", b"ab"), ("stderr", b"x\n"), ("stdout", b"c\nd"), ("stderr", b"tail")]
    write_record(tmp_path, writes)
    store = Store()
    ingest(tmp_path, store, final=False, max_bytes=1 << 20)
    assert store.lines == [("stderr", 4, "x"), ("stdout", 6, "abc")]
    ingest(tmp_path, store, final=True, max_bytes=1 << 20)  # the runner exited: partial lines are recorded
    assert store.lines[2:] == [("stdout", 7, "d"), ("stderr", 11, "tail")]


def _random_writes(rng: random.Random) -> list[tuple[str, bytes]]:
    words = [b"a", b"bb", b"\n", b"\n", b"\n", b"\xc3\xa9", b"\xff", b"\r\n", b"x" * 70_000, b"\xe2\x82", b"\xac"]
    writes = []
    for _ in range(rng.randint(1, 40)):
        stream = rng.choice(["stdout", "stderr"])
        chunk = b"".join(rng.choice(words) for _ in range(rng.randint(1, 12)))
        writes.append((stream, chunk))
    return writes


@pytest.mark.parametrize("seed", range(40))
def test_exactly_once_across_resumes_and_read_sizes(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    writes = _random_writes(rng)
    write_record(tmp_path, writes)
    expected = reference(writes)
    one_pass = Store()
    ingest(tmp_path, one_pass, final=True, max_bytes=4 << 20)
    for stream in ("stdout", "stderr"):
        assert [(p, t) for s, p, t in one_pass.lines if s == stream] == expected[stream]
    # Interrupted anywhere (a daemon killed after any step), with any read size: the same lines, in the same order.
    for max_bytes in (70_000, 100_003, 1 << 20):
        store = Store()
        while ingest(tmp_path, store, final=True, max_bytes=max_bytes, stop_after=rng.randint(1, 3)):
            pass
        assert store.lines == one_pass.lines, max_bytes


def test_a_record_written_while_it_is_read(tmp_path: Path) -> None:
    """The data grows between reads and the index entry of a switch is
    already there when its data is (the runner writes the entry first)."""
    rng = random.Random(7)
    writes = _random_writes(rng) + _random_writes(rng)
    store = Store()
    for k in range(1, len(writes) + 1):
        write_record(tmp_path, writes[:k])
        ingest(tmp_path, store, final=False, max_bytes=rng.choice([70_000, 1 << 20]))
    ingest(tmp_path, store, final=True, max_bytes=1 << 20)
    one_pass = Store()
    ingest(tmp_path, one_pass, final=True, max_bytes=1 << 20)
    assert sorted(store.lines, key=lambda x: (x[0], x[1])) == sorted(one_pass.lines, key=lambda x: (x[0], x[1]))
    expected = reference(writes)
    for stream in ("stdout", "stderr"):
        assert [(p, t) for s, p, t in store.lines if s == stream] == expected[stream]


@pytest.mark.parametrize("seed", range(8))
def test_a_growing_record_read_in_steps_cut_at_newlines(tmp_path: Path, seed: int) -> None:
    """Steps that are not final end just after the last newline of their
    last 64 KiB (RecordTailer._read_length): with any read size above and
    below that, interrupted and resumed, the lines are the record's, each
    once, whatever the record held at each read."""
    rng = random.Random(seed)
    writes = [w for _ in range(6) for w in _random_writes(rng)]
    store = Store()
    for k in range(1, len(writes) + 1, rng.randint(1, 4)):
        write_record(tmp_path, writes[:k])
        max_bytes = rng.choice([65_537, 70_000, 100_003, 300_000, 1 << 20])
        while ingest(tmp_path, store, final=False, max_bytes=max_bytes, stop_after=rng.randint(1, 3)):
            pass
    write_record(tmp_path, writes)
    ingest(tmp_path, store, final=True, max_bytes=1 << 20)
    expected = reference(writes)
    for stream in ("stdout", "stderr"):
        assert [(p, t) for s, p, t in store.lines if s == stream] == expected[stream]


def test_a_step_that_is_not_final_reads_up_to_a_newline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """So that its block is the bytes read, not a copy of all but their
    last partial line (RecordTailer._read_length)."""
    import supervisord.daemon.backends.local.tail as tail

    lines = b"".join(b"%05d %s\n" % (i, b"x" * (i % 150)) for i in range(20_000))
    write_record(tmp_path, [("stdout", lines + b"partial")])
    reads: list[bytes] = []
    real_pread = os.pread

    def pread(fd: int, n: int, offset: int) -> bytes:
        data = real_pread(fd, n, offset)
        reads.append(data)
        return data

    monkeypatch.setattr(tail.os, "pread", pread)
    store = Store()
    ingest(tmp_path, store, final=False, max_bytes=200_000)
    steps = [r for r in reads if len(r) > 65_536]  # not the index or the 64 KiB probes
    assert len(steps) >= len(lines) // 200_000
    assert all(r.endswith(b"\n") for r in steps)
    assert len(store.lines) == 20_000


def test_committed_text_is_freed_in_big_ranges_or_when_forced(tmp_path: Path) -> None:
    from supervisord.daemon.backends.local.tail import RELEASE_BYTES

    line = b"y" * 99 + b"\n"
    write_record(tmp_path, [("stdout", line * (RELEASE_BYTES // len(line) // 2))])
    data = tmp_path / OUTPUT_DATA
    tailer = RecordTailer(tmp_path, {})
    try:
        assert tailer.read_blocks(max_bytes=64 << 20)
        used = os.stat(data).st_blocks
        tailer.release()  # half of RELEASE_BYTES: kept for a bigger range
        assert os.stat(data).st_blocks == used
        tailer.release(force=True)  # the run's last drain
        assert os.stat(data).st_blocks * 512 < 64 * 1024
        with data.open("ab") as f:  # the runner appends (one stream: no new index entry)
            f.write(line * (RELEASE_BYTES // len(line) * 2))
        assert tailer.read_blocks(max_bytes=64 << 20)
        tailer.release()  # more than RELEASE_BYTES
        assert os.stat(data).st_blocks * 512 < 64 * 1024
    finally:
        tailer.close()


def test_many_switches_are_read_in_bounded_steps(tmp_path: Path) -> None:
    writes = [("stdout" if i % 2 == 0 else "stderr", f"line {i}\n".encode()) for i in range(3 * MAX_BLOCKS + 5)]
    write_record(tmp_path, writes)
    tailer = RecordTailer(tmp_path, {})
    sizes = []
    while items := tailer.read_blocks(final=True):
        sizes.append(len(items))
    tailer.close()
    assert max(sizes) <= MAX_BLOCKS and sum(sizes) == len(writes)


@pytest.mark.parametrize("splice", [True, False])
def test_the_runner_pumps_both_pipes_into_one_record(tmp_path: Path, splice: bool) -> None:
    """The runner's side: each move from a pipe is appended as it came, an
    index entry before each change of stream (with splice(2), and with the
    read-and-write fallback for file systems that cannot splice)."""
    from supervisord.daemon.backends.local import runner

    output = runner._Output(str(tmp_path))
    output.use_splice = splice
    out_w, err_w = output.open_pipes()
    out_r, err_r = (
        (fd for fd, s in output.pipes.items() if s == runner.STDOUT),
        (fd for fd, s in output.pipes.items() if s == runner.STDERR),
    )
    out_fd, err_fd = next(out_r), next(err_r)
    writes = [("stdout", b"out 1\n"), ("stderr", b"err 1\n"), ("stderr", b"err 2\npart"), ("stdout", b"out 2\n")]
    for stream, chunk in writes:
        os.write(out_w if stream == "stdout" else err_w, chunk)
        assert output.pump([out_fd if stream == "stdout" else err_fd])
    output.close_child_ends()
    output.drain()
    output.close()
    assert not output.pipes
    store = Store()
    ingest(tmp_path, store, final=True, max_bytes=1 << 20)
    assert [(s, t) for s, _, t in store.lines] == [
        ("stdout", "out 1"), ("stderr", "err 1"), ("stderr", "err 2"), ("stdout", "out 2"), ("stderr", "part"),
    ]  # fmt: skip
    assert (tmp_path / OUTPUT_DATA).read_bytes() == b"".join(chunk for _, chunk in writes)
    # One entry per change of stream (splicing may add one, describing no bytes, at a pipe's end).
    entries = (tmp_path / OUTPUT_INDEX).stat().st_size // INDEX_ENTRY
    assert entries == 3 or (splice and entries == 4)


@pytest.mark.parametrize("splice", [True, False])
def test_on_a_full_disk_the_runner_waits_and_loses_nothing(tmp_path: Path, splice: bool) -> None:
    """A write of the output that fails (ENOSPC) leaves the rest in the pipe
    (or held), stops reading, and is retried once space returns: the record
    ends up with every byte, in order."""
    from supervisord.daemon.backends.local import runner
    from tests.supervisord.test_storage_trouble import _fill, _tmpfs

    with _tmpfs(tmp_path / "fs", "1m") as fs:
        output = runner._Output(str(fs))
        output.use_splice = splice
        out_w, err_w = output.open_pipes()
        os.set_blocking(out_w, False)
        fds = {s: fd for fd, s in output.pipes.items()}
        filler = _fill(fs)
        sent = []
        for i in range(200):  # 220 KB, more than the pipe holds: the writer waits for the runner
            chunk = f"line {i:04d} ".encode() * 100 + b"\n"
            while True:
                try:
                    os.write(out_w, chunk)
                    break
                except BlockingIOError:
                    output.pump([fds[runner.STDOUT]])
                    if output.blocked:
                        assert output.readable() == []  # nothing is read while the disk is full
                        filler.unlink()  # space returns
                        output.retry_at = 0.0
            sent.append(chunk)
        os.write(err_w, b"the end\n")
        output.close_child_ends()
        output.drain()
        output.close()
        data = (fs / OUTPUT_DATA).read_bytes()
        assert data == b"".join(sent) + b"the end\n"
        assert not filler.exists()  # the disk was full at least once


class _Positions:
    """The reporter's ``log_position`` over a fixed table."""

    def __init__(self, table: dict[str, str]) -> None:
        self.table = table

    async def log_position(self, source: str) -> str | None:
        return self.table.get(source)


@pytest.mark.anyio
async def test_a_run_started_before_the_record_is_still_read_from_its_two_files(tmp_path: Path) -> None:
    """Runs in flight across an upgrade (their runner writes stdout.log and
    stderr.log) keep being ingested from where they were, as before."""
    from supervisord.daemon.backends.local import backend

    (tmp_path / "stdout.log").write_bytes(b"a\nb\nc\n")
    (tmp_path / "stderr.log").write_bytes(b"e\n")
    reporter = _Positions({"stdout": "2"})
    out = await backend._open_output(tmp_path, {"runner_pid": 1}, reporter, count_recorded=False)  # type: ignore[arg-type]
    assert isinstance(out, backend._LegacyOutput)
    got = [(b.source, b.text) for b, _ in out.read_blocks(final=True)]
    out.close()
    assert got == [("stdout", b"b\nc\n"), ("stderr", b"e\n")]
    # A run of this version (its handle names the record) reads the record.
    write_record(tmp_path, [("stdout", b"x\n")])
    out = await backend._open_output(tmp_path, {"output": "o"}, reporter, count_recorded=False)  # type: ignore[arg-type]
    assert not isinstance(out, backend._LegacyOutput)
    assert [(b.source, b.text) for b, _ in out.read_blocks(final=True)] == [("output.log:stdout", b"x\n")]
    out.close()
