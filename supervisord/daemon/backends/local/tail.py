"""Tailing a run's output into log blocks: :class:`RecordTailer` reads the
output record the runner writes (both streams in one order); :class:`FileTailer`
reads one plain file (the ``stdout.log``/``stderr.log`` of runs started by a
runner from before the record, still in flight across an upgrade).

Positions are byte offsets: ``pos`` is the offset just after a line's
newline, so the newest recorded position is exactly where to resume reading
after a reconnect or a daemon restart (see :func:`store.logsplit.split_lines`).
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import os
from pathlib import Path

from store import MAX_LINE_BYTES, LogBlock, split_block, split_lines
from supervisord.daemon.backends.local.protocol import INDEX_ENTRY, OUTPUT_DATA, OUTPUT_INDEX, STDERR, STDOUT

__all__ = ["MAX_BLOCKS", "RELEASE_BYTES", "FileTailer", "RecordTailer", "punch_hole", "record_source"]

_READ_CHUNK = 1 << 20

# fallocate(2) modes (linux/falloc.h).
_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02
_libc = ctypes.CDLL(None, use_errno=True)
_fallocate = _libc.fallocate
_fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
_fallocate.restype = ctypes.c_int


def punch_hole(path: Path, start: int, end: int) -> bool:
    """Free the disk blocks of bytes ``start .. end`` of ``path`` without
    changing its size or any offset (``fallocate(2)`` with
    ``FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE``: the range then reads as
    zeros). Returns False where the filesystem cannot (EOPNOTSUPP) or the
    file is gone; raises OSError otherwise."""
    if end <= start:
        return True
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        if _fallocate(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, start, end - start) != 0:
            err = ctypes.get_errno()
            if err in (errno.EOPNOTSUPP, errno.ENOSYS):
                return False
            raise OSError(err, f"fallocate(PUNCH_HOLE) of {path}: {os.strerror(err)}")
    finally:
        os.close(fd)
    return True


class FileTailer:
    """Reads complete lines appended to ``path`` from byte ``offset`` on.

    ``read(final=False)`` returns the lines completed since the last call
    (an unterminated last line is held back unless ``final``). A missing file
    reads as empty. Not thread-safe; cheap to call often.
    """

    def __init__(self, path: Path, offset: int = 0) -> None:
        self.path = path
        self.offset = offset
        self._released = 0
        self._fd: int | None = None

    def _open(self) -> int | None:
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return None
        return self._fd

    def read(self, *, final: bool = False, max_bytes: int = 8 * _READ_CHUNK) -> list[tuple[str, str]]:
        """Lines appended since the last call, at most about ``max_bytes`` of them."""
        fd = self._open()
        if fd is None:
            return []
        out: list[tuple[str, str]] = []
        budget = max_bytes
        while budget > 0:
            buf = os.pread(fd, min(_READ_CHUNK, budget), self.offset)
            if not buf:
                break
            at_eof = len(buf) < min(_READ_CHUNK, budget)
            lines, consumed = split_lines(buf, self.offset, final and at_eof)
            out.extend(lines)
            self.offset += consumed
            budget -= len(buf)
            if consumed == 0 or at_eof:
                break
        return out

    def read_block(self, stream: str, *, final: bool = False, max_bytes: int = 4 * _READ_CHUNK) -> LogBlock | None:
        """The complete lines appended since the last call, at most about
        ``max_bytes`` of them, as one block (None when there are none):
        one ``pread`` and one cut at the last newline
        (:func:`store.split_block`), no Python object per line. The offset
        moves past them; call :meth:`rewind` if recording them fails."""
        fd = self._open()
        if fd is None:
            return None
        while True:
            buf = os.pread(fd, max_bytes, self.offset)
            if not buf:
                return None
            at_eof = len(buf) < max_bytes
            block, consumed = split_block(buf, self.offset, final and at_eof, stream, stream)
            self.offset += consumed
            if block is not None or consumed == 0:
                return block

    def release(self) -> None:
        """Free the disk space of what was read so far (:func:`punch_hole`
        up to :attr:`offset`): call once it is committed. The file keeps its
        size and offsets; the text is then kept once, in the database."""
        if self.offset > self._released and punch_hole(self.path, self._released, self.offset):
            self._released = self.offset

    def skip_to_end(self) -> int:
        """Move the offset to the end of the file without reading; returns the bytes skipped."""
        try:
            size = os.stat(self.path).st_size
        except FileNotFoundError:
            return 0
        skipped = max(0, size - self.offset)
        self.offset += skipped
        return skipped

    def rewind(self, offset: int) -> None:
        """Read again from byte ``offset`` (the newest recorded position)."""
        self.offset = offset

    def close(self) -> None:
        """Close the file descriptor (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


# -- the output record (runner.py's output.log + output.idx) -----------------

_STREAM_OF = {STDOUT: "stdout", STDERR: "stderr"}
_STREAMS = ("stdout", "stderr")
#: Index entries read at once (64 KiB of index).
_ENTRIES_PER_READ = 8192
#: At most this many blocks per read step (one append: one transaction).
MAX_BLOCKS = 512
#: :meth:`RecordTailer.release` frees committed text in ranges of at least this many bytes.
RELEASE_BYTES = 32 << 20
#: The end of a read step is moved back to the last newline within this
#: many bytes (see :meth:`RecordTailer._read_length`).
_PROBE_BYTES = 1 << 16


def record_source(stream: str) -> str:
    """The log source of ``stream``'s lines in the output record:
    ``"output.log:stdout"`` / ``"output.log:stderr"`` (positions are byte
    offsets in ``output.log``; each stream has its own newest position)."""
    return f"{OUTPUT_DATA}:{stream}"


Spans = tuple[tuple[int, int], ...]


@dataclasses.dataclass
class _RecordState:
    """Where a :class:`RecordTailer` is; copied by :meth:`RecordTailer.mark`."""

    offset: int = 0  # the next data byte to read
    stream: str | None = None  # the stream of the byte at ``offset``
    entry: int = 0  # the number of the first index entry not yet applied
    #: stream -> (the bytes of its incomplete line, their (data offset, length) spans)
    pending: dict[str, tuple[bytes, Spans]] = dataclasses.field(default_factory=dict)
    #: stream -> data offset below which its bytes are already recorded (a resume)
    skip: dict[str, int] = dataclasses.field(default_factory=dict)
    recorded: int = 0  # bytes of the record recorded as lines (for local.max_log_bytes)

    def copy(self) -> _RecordState:
        return dataclasses.replace(self, pending=dict(self.pending), skip=dict(self.skip))


def _trim(spans: Spans, n: int) -> Spans:
    """``spans`` without their first ``n`` bytes."""
    out = []
    for start, length in spans:
        if n >= length:
            n -= length
            continue
        out.append((start + n, length - n))
        n = 0
    return tuple(out)


def _real(spans: Spans, index: int) -> int:
    """The data offset just after byte ``index - 1`` of the bytes laid out by ``spans``."""
    for start, length in spans:
        if index <= length:
            return start + index
        index -= length
    raise ValueError(f"index {index} is past the spans {spans}")


class RecordTailer:
    """Reads a run's output record (``output.log`` and ``output.idx``, see
    :mod:`supervisord.daemon.backends.local.runner`) into log blocks, in the
    record's order, each stream's lines under its own source
    (:func:`record_source`).

    A line's position is the data offset just after its newline (for a
    piece of an overlong line or a final unterminated line: just after its
    last byte), so lines are numbered in the order their ends arrived, and
    each stream's positions grow. A run of one stream's bytes is contiguous
    in ``output.log``: its complete lines become one block with implicit
    positions (no Python object per line). A line that the other stream
    interrupted is held (at most 64 KiB per stream) until its end arrives;
    its block then starts at a *virtual* offset (its end minus its length),
    which gives every line of the block its true position. The split into
    lines follows :func:`store.logsplit.split_lines` over each stream's own
    bytes, so it does not depend on how the record was read.

    ``positions``: stream -> the newest recorded position of its source (a
    resume after a restart): the first read starts at the first byte of
    either stream that is not yet recorded (found with a binary search of
    the index) and drops each stream's bytes below its position.
    ``count_recorded``: compute :attr:`recorded` at the resume (a walk of
    the index; only ``local.max_log_bytes`` needs it).
    """

    def __init__(
        self,
        run_dir: Path,
        positions: dict[str, int | None],
        *,
        count_recorded: bool = False,
        source_prefix: str = "",
    ) -> None:
        #: Put before every source name (``a2/``: a retried run's attempt 2, supervisord.shared.retry).
        self.source_prefix = source_prefix
        self.path = run_dir / OUTPUT_DATA
        self.index_path = run_dir / OUTPUT_INDEX
        self._positions = positions
        self._count = count_recorded
        self._state = _RecordState()
        self._resumed = False
        self._released = 0
        self._data: int | None = None
        self._index: int | None = None

    # -- files ---------------------------------------------------------------

    def _open(self) -> bool:
        if self._data is None:
            try:
                data = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return False
            try:
                self._index = os.open(self.index_path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                os.close(data)
                return False
            self._data = data
        if not self._resumed:
            self._resume()
            self._resumed = True
        return True

    def _entries(self, first: int, count: int) -> list[tuple[int, str]]:
        """Index entries ``first .. first + count - 1`` that are complete, as (offset, stream)."""
        assert self._index is not None
        raw = os.pread(self._index, count * INDEX_ENTRY, first * INDEX_ENTRY)
        return [
            (int.from_bytes(raw[at : at + 7], "big"), _STREAM_OF.get(raw[at + 7], "stdout"))
            for at in range(0, len(raw) - INDEX_ENTRY + 1, INDEX_ENTRY)
        ]

    def _entry_count(self) -> int:
        assert self._index is not None
        return os.fstat(self._index).st_size // INDEX_ENTRY

    def _last_at_or_before(self, offset: int, count: int) -> int:
        """The number of the last index entry (of the first ``count``) with data offset <= ``offset``, or -1."""
        lo, hi = 0, count  # the answer is in [lo - 1, hi - 1]
        while lo < hi:
            mid = (lo + hi) // 2
            if self._entries(mid, 1)[0][0] <= offset:
                lo = mid + 1
            else:
                hi = mid
        return lo - 1

    def _resume(self) -> None:
        """Start at the first byte of either stream not yet recorded (class docstring)."""
        assert self._data is not None
        size = os.fstat(self._data).st_size  # before the index: every switch below it is in the index
        count = self._entry_count()
        st = self._state
        start = size
        for stream in _STREAMS:
            skip = self._positions.get(stream) or 0
            st.skip[stream] = skip
            k = self._last_at_or_before(skip, count)
            first = size
            if k >= 0 and self._entries(k, 1)[0][1] == stream:
                first = min(skip, size)
            else:
                for j in range(k + 1, count):  # entries alternate: the next one is this stream's
                    at, s = self._entries(j, 1)[0]
                    if s == stream:
                        first = min(at, size)
                        break
            start = min(start, first)
        k = self._last_at_or_before(start, count)
        st.offset = start
        st.entry = k + 1
        st.stream = self._entries(k, 1)[0][1] if k >= 0 else None
        if self._count:
            st.recorded = self._recorded_below(count)

    def _recorded_below(self, count: int) -> int:
        """Bytes of each stream below its newest recorded position (a walk of the index)."""
        total = 0
        limits = {s: self._state.skip.get(s, 0) for s in _STREAMS}
        stop = max(limits.values())
        prev: tuple[int, str] | None = None
        for first in range(0, count, _ENTRIES_PER_READ):
            for at, stream in self._entries(first, _ENTRIES_PER_READ):
                if prev is not None:
                    total += max(0, min(at, limits[prev[1]]) - prev[0])
                prev = (at, stream)
                if at >= stop:
                    return total
        if prev is not None:
            total += max(0, limits[prev[1]] - prev[0])
        return total

    # -- reading ---------------------------------------------------------------

    def read_blocks(self, *, final: bool = False, max_bytes: int = 4 << 20) -> list[tuple[LogBlock, int]]:
        """The blocks completed since the last call, in order, each with the
        record bytes it covers, from at most ``max_bytes`` of the record and
        at most :data:`MAX_BLOCKS` blocks (an empty list: nothing new).
        ``final``: the runner has exited (the record is complete): at its
        end, incomplete lines are recorded as they are. The position moves
        past them; :meth:`mark` before and :meth:`rewind` if recording them
        fails."""
        if not self._open():
            return []
        while True:
            offset = self._state.offset
            out = self._step(final, max_bytes)
            if out or self._state.offset == offset:
                return out  # blocks, or nothing new (a read that only held bytes goes on)

    def _read_length(self, final: bool, max_bytes: int) -> int:
        """How many bytes of the record the next step reads: ``max_bytes``,
        or, unless ``final``, fewer so that the read ends just after the
        last newline in its last :data:`_PROBE_BYTES` (one small ``pread``
        to find it). A read that ends at a newline is a block as it is: the
        cut at the last newline (:func:`store.split_block`) then copies
        nothing, where a read that ends inside a line is copied whole (8 MiB
        of fresh memory per step of a flood, about a tenth of the daemon's
        CPU per logged byte). The bytes after that newline are read next
        time, as an incomplete line always was."""
        assert self._data is not None
        if final:
            return max_bytes
        offset = self._state.offset
        end = min(offset + max_bytes, os.fstat(self._data).st_size)
        if end - offset <= _PROBE_BYTES:
            return max_bytes
        newline = os.pread(self._data, _PROBE_BYTES, end - _PROBE_BYTES).rfind(b"\n")
        return max_bytes if newline < 0 else end - _PROBE_BYTES + newline + 1 - offset

    def _step(self, final: bool, max_bytes: int) -> list[tuple[LogBlock, int]]:
        assert self._data is not None
        st = self._state
        length = self._read_length(final, max_bytes)
        buf = os.pread(self._data, length, st.offset)
        at_eof = len(buf) < length
        end = st.offset + len(buf)
        entries = [e for e in self._entries(st.entry, _ENTRIES_PER_READ) if e[0] < end] if buf else []
        if len(entries) == _ENTRIES_PER_READ:  # more switches than read: stop at the last one read
            end, at_eof = entries[-1][0], False
            entries.pop()
        out: list[tuple[LogBlock, int]] = []
        pos, i = st.offset, 0
        while pos < end and len(out) < MAX_BLOCKS:
            while i < len(entries) and entries[i][0] <= pos:
                st.stream = entries[i][1]
                st.entry += 1
                i += 1
            stream = st.stream or "stdout"
            seg_end = entries[i][0] if i < len(entries) else end
            complete = i < len(entries) or (final and at_eof)
            pos = self._piece(stream, buf[pos - st.offset : seg_end - st.offset], pos, complete, out)
            if pos < seg_end:
                break  # an incomplete line at the end of what was read: read it again next time
        consumed_to = pos
        if final and at_eof and consumed_to >= end and len(out) < MAX_BLOCKS:
            for stream, (data, spans) in sorted(st.pending.items(), key=lambda kv: _real(kv[1][1], len(kv[1][0]))):
                lines, _ = split_lines(data, 0, True)
                pairs = [(str(_real(spans, int(p))), text) for p, text in lines]
                out.append((LogBlock.from_pairs(stream, self.source_prefix + record_source(stream), pairs), len(data)))
                st.recorded += len(data)
            st.pending = {}
        st.offset = consumed_to
        return out

    def _piece(self, stream: str, piece: bytes, at: int, complete: bool, out: list[tuple[LogBlock, int]]) -> int:
        """Split one run of ``stream``'s bytes (``piece``, at data offset
        ``at``) after its held incomplete line; append the block to ``out``.
        ``complete``: the run ends here (the other stream follows, or the
        record is final): what is left is held. Returns the data offset
        reached (before ``at + len(piece)`` only for an incomplete line at
        the end of what was read, to be read again)."""
        st = self._state
        stop = at + len(piece)
        skip = st.skip.get(stream, 0)
        if stop <= skip:
            return stop
        if at < skip:
            piece, at = piece[skip - at :], skip
        held, spans = st.pending.pop(stream, (b"", ()))
        joined = held + piece if held else piece
        vbase = at - len(held)
        source = self.source_prefix + record_source(stream)
        consumed = 0
        while True:  # a clean prefix, then (rarely) the pieces of an overlong line after it
            block, took = split_block(
                joined[consumed:] if consumed else joined, vbase + consumed, False, stream, source
            )
            if block is None:
                break
            if block.positions is not None and consumed < len(held):
                # A cut of an overlong line may fall in the held bytes: give it its true offset.
                fixed = tuple(
                    str(_real(spans, int(p) - vbase)) if int(p) - vbase <= len(held) else p for p in block.positions
                )
                block = dataclasses.replace(block, positions=fixed)
            out.append((block, took))
            st.recorded += took
            consumed += took
            if len(joined) - consumed <= MAX_LINE_BYTES:
                break
        if complete:
            rest = joined[consumed:]
            if rest:
                st.pending[stream] = (rest, _trim((*spans, (at, len(piece))), consumed))
            return stop
        if consumed < len(held):
            st.pending[stream] = (held[consumed:], _trim(spans, consumed))
            return at
        return at + consumed - len(held)

    # -- position ----------------------------------------------------------------

    def mark(self) -> _RecordState:
        """The current position, for :meth:`rewind`."""
        return self._state.copy()

    def rewind(self, mark: _RecordState) -> None:
        """Go back to ``mark`` (what was read since is read again; the store
        drops lines it already has)."""
        self._state = mark.copy()

    @property
    def recorded(self) -> int:
        """Bytes of the record read into blocks so far (see ``count_recorded``)."""
        return self._state.recorded

    @recorded.setter
    def recorded(self, value: int) -> None:
        self._state.recorded = value

    def backlog(self) -> int:
        """Bytes of the record not yet read into lines."""
        held = sum(len(data) for data, _ in self._state.pending.values())
        return max(0, _file_size(self.path) - self._state.offset) + held

    def unread(self) -> int:
        """Bytes of the record not yet read (a ``stat``; held lines not counted)."""
        return max(0, _file_size(self.path) - self._state.offset)

    def release(self, *, force: bool = False) -> None:
        """Free the disk space of ``output.log`` below the first byte still
        needed (the next to read, or the start of a held line): call once
        what was read is committed. Offsets are unchanged. Unless ``force``
        (the run's last drain), only once :data:`RELEASE_BYTES` or more can
        be freed: punching a file in a few big ranges costs about a third
        less than one read step at a time (the kernel's work per call),
        and the run's file then holds at most that much text that is also in
        the database."""
        st = self._state
        safe = min([st.offset] + [spans[0][0] for _, spans in st.pending.values() if spans])
        if safe - self._released < (1 if force else RELEASE_BYTES):
            return
        if punch_hole(self.path, self._released, safe):
            self._released = safe

    def skip_to_end(self) -> int:
        """Move past everything in the record without recording it (held
        lines included); returns the bytes skipped."""
        if not self._open():
            return 0
        st = self._state
        size = _file_size(self.path)
        skipped = max(0, size - st.offset) + sum(len(data) for data, _ in st.pending.values())
        st.pending = {}
        while True:
            batch = self._entries(st.entry, _ENTRIES_PER_READ)
            for at, stream in batch:
                if at > size:
                    break
                st.stream = stream
                st.entry += 1
            if len(batch) < _ENTRIES_PER_READ or batch[-1][0] > size:
                break
        st.offset = max(st.offset, size)
        return skipped

    def close(self) -> None:
        """Close the files (idempotent)."""
        for fd in (self._data, self._index):
            if fd is not None:
                os.close(fd)
        self._data = self._index = None


def _file_size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0
