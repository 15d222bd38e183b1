"""Log text in blocks: many consecutive lines of one source in one row.

A run's log is numbered 1, 2, 3... in the order lines were first recorded.
Its text lives in ``log_blocks`` (beside the event log, in the same
database): one row holds lines ``first_line .. first_line + lines - 1`` of
one (run, source) as one UTF-8 text in which every line ends with ``\\n``.
The ``LogLines`` event that recorded the block is the audit record: which
lines, which positions, how many bytes and their sha256 (see
:data:`store.types.LOG_LINES`); the text is never inside a new event, so a
block's text can later be archived or deleted (retention) without touching
an event.

**Positions and de-duplication by order.** Every line has a position in
its source, ordered within the source. A block given as :class:`LogBlock`
is either

* *implicit* (``start`` set): a byte range of a file that starts at byte
  ``start``; each line's position is the offset just after its ``\\n``
  (``start`` + the UTF-8 length of the lines up to and including it). The
  producer guarantees the text is the file's bytes unchanged (the local
  tailer sends only such "clean" ranges: valid UTF-8, no ``\\r\\n``, no line
  over :data:`store.logsplit.MAX_LINE_BYTES`); or
* *explicit* (``positions`` set): one position string per line.

At append the store keeps exactly the lines past the newest recorded
position of the (run, source): positions that are decimal integers (byte
offsets) compare as integers, so a replayed read -- from any earlier line
-- adds only what is new; other positions (the Kubernetes
``"<timestamp>#<n>"`` cursor, whose timestamps may step back) are matched
exactly: a block holding the newest recorded position keeps only the
lines after it, and a position repeated within the block is kept once.
No per-line rows are kept for this: the newest position of each source
(``log_sources``) is enough.

Retention (:mod:`store.archive`) moves a terminal run's blocks into one
verified file and deletes their rows, in the transaction that records
``LogsArchived``; reads of those lines then come from the file.

Migration to schema 3 (:func:`migrate_v3`) turns the lines of schema-2
``LogLines`` events (which held ``[pos, text]`` pairs) into blocks, by the
schema-2 rule (a position already recorded adds nothing).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:  # annotations only: the CLI imports LogBlock, not the engine
    import aiosqlite

from store._accel import count_newlines
from store.types import LogLine

__all__ = [
    "LOG_BLOCKS_DDL",
    "BlockResolver",
    "LogBlock",
    "block_lines",
    "last_lines",
    "lines_after",
    "migrate_v3",
    "skip_lines",
    "skip_offset",
    "text_digest",
]

#: The block table (schema 3). ``text`` is NULL once archived or deleted
#: (retention); ``positions`` is NULL for implicit byte-offset blocks
#: (positions derived from ``start`` and the text), else the lines'
#: positions joined by ``\\n``.
LOG_BLOCKS_DDL: Final[tuple[str, ...]] = (
    """CREATE TABLE log_blocks (
        id         INTEGER PRIMARY KEY,
        run_id     TEXT    NOT NULL,
        first_line INTEGER NOT NULL,
        lines      INTEGER NOT NULL,
        seq        INTEGER NOT NULL,
        stream     TEXT    NOT NULL,
        source     TEXT    NOT NULL,
        first_pos  TEXT    NOT NULL,
        last_pos   TEXT    NOT NULL,
        start      INTEGER,
        positions  TEXT,
        bytes      INTEGER NOT NULL,
        text       BLOB
    )""",
    "CREATE UNIQUE INDEX log_blocks_by_line ON log_blocks (run_id, first_line)",
    "CREATE INDEX log_blocks_by_seq ON log_blocks (seq)",
)

_INSERT_BLOCK: Final = (
    "INSERT INTO log_blocks (run_id, first_line, lines, seq, stream, source, first_pos, last_pos, start,"
    " positions, bytes, text) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_LAST_LINE: Final = "SELECT first_line + lines - 1 FROM log_blocks WHERE run_id = ? ORDER BY first_line DESC LIMIT 1"
_NEWEST_POS: Final = "SELECT pos FROM log_sources WHERE run_id = ? AND source = ?"
# The same for many runs at once (BlockResolver.prefetch): runs as a JSON array.
_LAST_LINES: Final = (
    "SELECT j.value, (SELECT first_line + lines - 1 FROM log_blocks WHERE run_id = j.value"
    " ORDER BY first_line DESC LIMIT 1) FROM json_each(?) AS j"
)
_NEWEST_POSES: Final = "SELECT run_id, source, pos FROM log_sources WHERE run_id IN (SELECT value FROM json_each(?))"


@dataclasses.dataclass(frozen=True, slots=True)
class LogBlock:
    """Consecutive lines of one source, to be recorded as one block.

    ``stream``: ``"stdout"`` | ``"stderr"``. ``source``: where positions are
    measured (``"stdout"`` file, ``"pod/container"``). ``text``: the lines as
    UTF-8, each ending with ``\\n`` (a line never holds ``\\n``). Exactly
    one of ``start`` (implicit byte-offset positions, int >= 0) and
    ``positions`` (one str per line) is set; see the module docstring.
    ``lines``: the number of lines of ``text`` (``text.count(b"\\n")``)
    when the producer has counted them already (:func:`store.split_block`
    does, in the pass that checks the text), so the store does not count
    again; None: the store counts.
    """

    stream: str
    source: str
    text: bytes
    start: int | None = None
    positions: tuple[str, ...] | None = None
    lines: int | None = None

    def validate(self, run_id: str) -> None:
        """Raise ValueError naming the run and the fault for a malformed block."""
        if self.stream not in ("stdout", "stderr"):
            raise ValueError(f"run {run_id}: a log block's stream must be 'stdout' or 'stderr', got {self.stream!r}")
        if not isinstance(self.source, str) or not self.source:
            raise ValueError(f"run {run_id}: a log block needs a non-empty source, got {self.source!r}")
        if not isinstance(self.text, bytes) or (self.text and not self.text.endswith(b"\n")):
            raise ValueError(f"run {run_id}: a log block's text must be bytes ending with a newline")
        if (self.start is None) == (self.positions is None):
            raise ValueError(f"run {run_id}: a log block needs exactly one of start and positions")
        if self.start is not None and (not isinstance(self.start, int) or self.start < 0):
            raise ValueError(f"run {run_id}: a log block's start must be an int >= 0, got {self.start!r}")
        if self.lines is not None and (not isinstance(self.lines, int) or self.lines < 0):
            raise ValueError(f"run {run_id}: a log block's lines must be an int >= 0, got {self.lines!r}")
        if self.positions is not None and len(self.positions) != self.text.count(b"\n"):
            count = self.text.count(b"\n")
            raise ValueError(f"run {run_id}: a log block has {count} lines but {len(self.positions)} positions")

    @classmethod
    def from_pairs(cls, stream: str, source: str, lines: Iterable[Sequence[str]]) -> LogBlock:
        """A block with explicit positions from ``(pos, text)`` pairs (the
        schema-2 shape of ``LogLines`` data). Raises ValueError for a text
        holding a newline (it would read back as two lines)."""
        positions: list[str] = []
        texts: list[str] = []
        for pos, text in lines:
            positions.append(pos)
            texts.append(text)
        joined = "\n".join(texts)
        if joined.count("\n") != max(0, len(texts) - 1):
            raise ValueError(f"source {source}: a log line's text must not hold a newline")
        raw = (joined + "\n").encode("utf-8") if texts else b""
        return cls(stream, source, raw, positions=tuple(positions))


def text_digest(text: bytes) -> str:
    """``"sha256:<hex>"`` of ``text``."""
    return "sha256:" + hashlib.sha256(text).hexdigest()


def _is_offset(pos: str | None) -> bool:
    return pos is not None and pos.isdigit() and pos.isascii()


def _keep_explicit(positions: Sequence[str], newest: str | None) -> list[int]:
    """Indexes of the lines of an explicit block past ``newest`` (module docstring)."""
    if all(_is_offset(p) for p in positions) and (newest is None or _is_offset(newest)):
        high = -1 if newest is None else int(newest)
        keep = []
        for i, pos in enumerate(positions):
            value = int(pos)
            if value > high:
                keep.append(i)
                high = value
        return keep
    first = 0
    if newest is not None:
        for i in range(len(positions) - 1, -1, -1):
            if positions[i] == newest:
                first = i + 1
                break
    seen: set[str] = set()
    keep = []
    for i in range(first, len(positions)):
        if positions[i] not in seen:
            seen.add(positions[i])
            keep.append(i)
    return keep


class BlockResolver:
    """Turns :class:`LogBlock` appends into block rows and ``LogLines`` data,
    inside one write transaction (create one per transaction: it caches
    each run's last line number and each source's newest position as the
    batch goes)."""

    def __init__(self, conn: aiosqlite.Connection) -> None:
        self._conn = conn
        self._last_line: dict[str, int] = {}
        self._newest: dict[tuple[str, str], str | None] = {}
        self.rows: list[tuple[Any, ...]] = []

    async def prefetch(self, keys: Collection[tuple[str, str]]) -> None:
        """Read the last line number of every run and the newest position of
        every ``(run_id, source)`` of ``keys`` in two queries, before the
        batch's first block (a batch with the first output of 500 reattached
        runs otherwise asks twice per run). Call it before :meth:`resolve`."""
        runs = sorted({run_id for run_id, _ in keys} - set(self._last_line))
        if len(runs) < 2:
            return  # one run: the lazy reads are as few
        ids = json.dumps(runs)
        for run_id, last in await self._conn.execute_fetchall(_LAST_LINES, (ids,)):
            self._last_line[str(run_id)] = int(last or 0)
        newest = {
            (str(r), str(src)): str(pos) for r, src, pos in await self._conn.execute_fetchall(_NEWEST_POSES, (ids,))
        }
        for key in keys:
            self._newest.setdefault(key, newest.get(key))

    async def _last(self, run_id: str) -> int:
        if run_id not in self._last_line:
            rows = list(await self._conn.execute_fetchall(_LAST_LINE, (run_id,)))
            self._last_line[run_id] = int(rows[0][0]) if rows else 0
        return self._last_line[run_id]

    async def _newest_pos(self, run_id: str, source: str) -> str | None:
        key = (run_id, source)
        if key not in self._newest:
            rows = list(await self._conn.execute_fetchall(_NEWEST_POS, key))
            self._newest[key] = str(rows[0][0]) if rows else None
        return self._newest[key]

    async def resolve(self, run_id: str, seq: int, block: LogBlock) -> dict[str, Any]:
        """The ``LogLines`` data recording ``block`` as event ``seq`` of
        ``run_id``, keeping only its lines past the newest recorded
        position; queues the block row (see :attr:`rows`)."""
        newest = await self._newest_pos(run_id, block.source)
        text, start, positions = block.text, block.start, block.positions
        offered = lines = count_newlines(text) if block.lines is None else block.lines
        if start is not None:
            end = start + len(text)
            if newest is not None and _is_offset(newest) and int(newest) > start:
                cut = int(newest) - start
                if cut >= len(text):
                    text = b""
                else:
                    # The first kept line starts after the last newline before the cut.
                    keep_from = text.rfind(b"\n", 0, cut) + 1
                    text, start = text[keep_from:], start + keep_from
                lines = count_newlines(text)
            if text:
                nl = text.find(b"\n")
                first_pos, last_pos = str(start + nl + 1), str(end)
        else:
            assert positions is not None
            keep = _keep_explicit(positions, newest)
            if len(keep) < len(positions):
                pieces = text.split(b"\n")
                text = b"".join(pieces[i] + b"\n" for i in keep)
                positions = tuple(positions[i] for i in keep)
                lines = len(keep)
            if positions:
                first_pos, last_pos = positions[0], positions[-1]
        first_line = await self._last(run_id) + 1
        data: dict[str, Any] = {"stream": block.stream, "source": block.source, "first_line": first_line,
                                "line_count": lines}  # fmt: skip
        if offered > lines:
            data["replayed"] = offered - lines
        if not lines:
            return data
        data.update(first_pos=first_pos, last_pos=last_pos, bytes=len(text), sha256=text_digest(text))
        self.rows.append((run_id, first_line, lines, seq, block.stream, block.source, first_pos, last_pos,
                          start, None if positions is None else "\n".join(positions), len(text), text))  # fmt: skip
        self._last_line[run_id] = first_line + lines - 1
        self._newest[(run_id, block.source)] = last_pos
        return data

    async def flush(self) -> None:
        """Insert the queued block rows."""
        if self.rows:
            await self._conn.executemany(_INSERT_BLOCK, self.rows)
            self.rows = []


#: Window of :func:`skip_offset`: counting runs over whole windows; only the
#: window holding the wanted newline is split (at most this many objects).
_SKIP_WINDOW = 1 << 16


def skip_offset(text: bytes, n: int) -> tuple[int, int]:
    """``(offset, skipped)``: the byte offset in ``text`` just after its
    ``n``-th newline, and ``n``; when ``text`` has fewer newlines,
    ``(len(text), how many it has)``. Counting and splitting run in C over
    64 KiB windows: no Python step per line, and at most one window's lines
    as objects at a time."""
    at, left = 0, n
    size = len(text)
    while left > 0 and at < size:
        end = min(size, at + _SKIP_WINDOW)
        found = count_newlines(text, at, end)
        if found < left:
            left -= found
            at = end
            continue
        rest = text[at:end].split(b"\n", left)[-1]  # what follows the left-th newline of the window
        return end - len(rest), n
    return at, n - left


def skip_lines(text: bytes, n: int) -> bytes:
    """``text`` without its first ``n`` lines (newline-terminated lines)."""
    if n <= 0:
        return text
    return text[skip_offset(text, n)[0] :]


def last_lines(text: bytes, n: int) -> bytes:
    """The last ``n`` lines of ``text`` (newline-terminated lines), found
    from the end: a tail of a big block costs ``n`` searches, not one per
    line of the block."""
    if n <= 0:
        return b""
    at = len(text) - 1  # the last newline
    for _ in range(n):
        nl = text.rfind(b"\n", 0, at)
        if nl < 0:
            return text
        at = nl
    return text[at + 1 :]


def lines_after(text: bytes, skip: int, total: int) -> bytes:
    """``text`` (``total`` lines) without its first ``skip`` lines: a few
    lines from the end by searching back, else by :func:`skip_offset`."""
    if skip <= 0:
        return text
    if skip >= total:
        return b""
    if total - skip <= _FEW_LINES:
        return last_lines(text, total - skip)
    return skip_lines(text, skip)


#: At most this many lines are found from the end one search at a time.
_FEW_LINES = 64


def block_lines(run_id: str, rows: Iterable[Sequence[Any]], after_line: int, limit: int) -> list[LogLine]:
    """The :class:`LogLine` list of ``log_blocks`` rows selected as
    ``first_line, seq, stream, source, first_pos, start, positions, text``
    in ``first_line`` order: the lines numbered after ``after_line``, at
    most ``limit``. Only the lines returned are decoded. A row whose text
    is gone (retention) raises ValueError."""
    out: list[LogLine] = []
    for first_line, seq, stream, source, _first_pos, start, positions, text in rows:
        if len(out) >= limit:
            break
        if text is None:
            raise ValueError(f"run {run_id}: the text of lines {first_line}.. is not in the database")
        raw = bytes(text)
        at, index = skip_offset(raw, max(0, after_line + 1 - first_line))
        pos_list = positions.split("\n") if positions is not None else None
        while len(out) < limit:
            nl = raw.find(b"\n", at)
            if nl < 0:
                break
            pos = pos_list[index] if pos_list is not None else str(start + nl + 1)
            out.append(LogLine(run_id, first_line + index, stream, source, pos,
                               raw[at:nl].decode("utf-8", "replace"), seq))  # fmt: skip
            at, index = nl + 1, index + 1
    return out


async def migrate_v3(conn: aiosqlite.Connection) -> None:
    """Schema 2 -> 3 (inside the migration's transaction): drop the
    schema-2 log projections, create ``log_blocks`` and fill it from the
    ``[pos, text]`` lines of the existing ``LogLines`` events, numbering
    each run's lines by the schema-2 rule (in seq order, a (source, pos)
    already recorded adds nothing). One run at a time, so memory holds one
    run's positions."""
    for table in ("log_blocks", "log_positions", "log_sources"):
        await conn.execute(f"DROP TABLE IF EXISTS {table}")
    for statement in LOG_BLOCKS_DDL:
        await conn.execute(statement)
    run_ids = [str(r[0]) for r in await conn.execute_fetchall(
        "SELECT DISTINCT run_id FROM events WHERE type = 'LogLines'")]  # fmt: skip
    for run_id in run_ids:
        seen: set[tuple[str, str]] = set()
        line = 0
        rows: list[tuple[Any, ...]] = []
        async with conn.execute(
            "SELECT seq, data FROM events WHERE run_id = ? AND type = 'LogLines' ORDER BY seq", (run_id,)
        ) as cursor:
            async for seq, data_json in cursor:
                data = json.loads(data_json)
                pairs = data.get("lines")
                if not isinstance(pairs, list):
                    continue
                source = data["source"]
                kept = []
                for pos, text in pairs:
                    if (source, pos) not in seen:
                        seen.add((source, pos))
                        kept.append((pos, text))
                if not kept:
                    continue
                positions = "\n".join(p for p, _ in kept)
                text = "".join(t.replace("\n", " ") + "\n" for _, t in kept).encode("utf-8", "surrogatepass")
                rows.append((run_id, line + 1, len(kept), seq, data["stream"], source, kept[0][0], kept[-1][0],
                             None, positions, len(text), text))  # fmt: skip
                line += len(kept)
        await conn.executemany(_INSERT_BLOCK, rows)
