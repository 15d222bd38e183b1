"""Split raw output bytes into log lines with their source positions.

Used by tailers (the local backend reads a run's ``stdout``/``stderr`` files):
they read a chunk at file offset ``base_offset``, call :func:`split_lines`,
record the lines as one ``LogLines`` event and continue reading at
``base_offset + consumed``.

The positions are byte offsets in the file, rendered as decimal strings, so
that re-reading the same bytes after a restart yields the same positions and
the store's (run, source, pos) deduplication makes the replay exactly-once.
For that, the split depends only on the bytes of the file, never on how they
were chunked into reads: an incomplete last line is left unconsumed until its
newline arrives (or the caller says ``final``), and an overlong line is cut
at fixed points counted from the line's start.
"""

from __future__ import annotations

from typing import Final

from store._accel import scan
from store.logblocks import LogBlock

__all__ = ["MAX_LINE_BYTES", "split_block", "split_lines", "split_text"]

#: A line longer than this many bytes is recorded as several pieces.
MAX_LINE_BYTES: Final = 65536


def _cut_point(buf: bytes, start: int) -> int:
    """Where to cut an overlong line that starts at ``start``: ``start +
    MAX_LINE_BYTES``, moved back (by at most 3 bytes) to the first byte of a
    UTF-8 sequence that would otherwise straddle the cut."""
    cut = start + MAX_LINE_BYTES
    for back in range(1, 4):
        byte = buf[cut - back]
        if byte & 0xC0 != 0x80:  # an ASCII byte or a lead byte
            if byte >= 0xC0:
                length = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
                if length > back:  # the sequence would run past the cut
                    return cut - back
            return cut
    return cut  # three continuation bytes: the cut falls after a complete sequence or in garbage


def _decode(piece: bytes) -> str:
    return piece.decode("utf-8", errors="replace")


def split_text(text: str) -> list[str]:
    """One line's text as the pieces it is recorded in: ``[text]``, or for a
    line longer than :data:`MAX_LINE_BYTES` bytes of UTF-8, pieces of at
    most that many bytes cut as :func:`split_lines` cuts them (for sources
    that deliver whole lines, such as a Kubernetes log stream)."""
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) <= MAX_LINE_BYTES:
        return [text]
    pieces: list[str] = []
    start = 0
    while len(raw) - start > MAX_LINE_BYTES:
        cut = _cut_point(raw, start)
        pieces.append(_decode(raw[start:cut]))
        start = cut
    pieces.append(_decode(raw[start:]))
    return pieces


def split_lines(buf: bytes, base_offset: int, final: bool) -> tuple[list[tuple[str, str]], int]:
    """Split ``buf``, read from a file at byte ``base_offset``, into lines.

    Returns ``(lines, consumed)``: ``lines`` is a list of ``(pos, text)``
    where ``pos`` is ``str(end_offset)``, the file offset just after the
    line's ``\\n`` (for a piece of an overlong line or a final unterminated
    line: just after the piece), and ``text`` is the line without its
    ``\\n`` (and without a ``\\r`` right before it), decoded as UTF-8 with
    invalid bytes replaced by U+FFFD, so binary output never raises.
    ``consumed`` is how many bytes of ``buf`` the lines cover; the caller
    keeps ``buf[consumed:]`` and prepends it to its next read.

    * An incomplete trailing line (no ``\\n`` yet) is not consumed unless
      ``final`` is true (the writer has exited), in which case it is
      returned as the last line.
    * A line longer than :data:`MAX_LINE_BYTES` (65536) bytes is split
      into pieces of at most that many bytes, each a line of its own; a
      piece is emitted as soon as more than 65536 bytes of the line are
      present, even if not ``final``. A cut that would fall inside a UTF-8
      multi-byte sequence is moved back to the sequence's first byte.
    """
    lines: list[tuple[str, str]] = []
    start = 0
    end = len(buf)
    while start < end:
        newline = buf.find(b"\n", start, start + MAX_LINE_BYTES + 1)
        if newline == -1:
            if end - start > MAX_LINE_BYTES:  # overlong line: emit one piece
                cut = _cut_point(buf, start)
                lines.append((str(base_offset + cut), _decode(buf[start:cut])))
                start = cut
                continue
            if final:
                lines.append((str(base_offset + end), _decode(buf[start:end])))
                start = end
            break
        stop = newline - 1 if newline > start and buf[newline - 1] == 0x0D else newline
        lines.append((str(base_offset + newline + 1), _decode(buf[start:stop])))
        start = newline + 1
    return lines, start


#: Window for the overlong-line check in :func:`split_block`: a line over
#: MAX_LINE_BYTES holds a whole aligned window of half that without a newline.
_WINDOW: Final = MAX_LINE_BYTES // 2


def _clean_lines(raw: bytes) -> int | None:
    """The number of lines of the complete lines ``raw`` when they are
    stored as they are by :func:`split_lines` -- valid UTF-8, no ``\r\n``,
    no line that may be over :data:`MAX_LINE_BYTES` (conservatively: none
    with a window of 32 KiB without a newline) -- else None. One pass
    (:func:`store._accel.scan`, in C when built); only text that holds a
    ``\r`` is searched for ``\r\n``, and only text that is not ASCII is
    decoded."""
    newlines, has_return, ascii_only, bare_windows = scan(raw, _WINDOW)
    if bare_windows or (has_return and b"\r\n" in raw):
        return None
    if not ascii_only:
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return newlines


def split_block(buf: bytes, base_offset: int, final: bool, stream: str, source: str) -> tuple[LogBlock | None, int]:
    """The lines of ``buf`` (read from a file at byte ``base_offset``) as one
    :class:`~store.logblocks.LogBlock`, exactly as :func:`split_lines`
    splits them, and how many bytes of ``buf`` it covers (``(None, 0)``
    when no line is complete yet).

    The common case -- complete lines of valid UTF-8 without ``\r\n`` or
    overlong lines -- is cut at the last newline and recorded as the bytes
    themselves with implicit byte-offset positions: no Python object per
    line. Anything else goes through :func:`split_lines` into a block with
    explicit positions.
    """
    cut = buf.rfind(b"\n") + 1
    if cut and not (final and cut < len(buf)):
        text = buf[:cut]  # one copy (none when buf ends with a newline)
        count = _clean_lines(text)
        if count is not None:
            return LogBlock(stream, source, text, start=base_offset, lines=count), cut
    lines, consumed = split_lines(buf, base_offset, final)
    if not lines:
        return None, consumed
    return LogBlock.from_pairs(stream, source, lines), consumed
