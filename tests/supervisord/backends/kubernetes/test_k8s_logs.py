"""Log positions and replays: the cursor arithmetic that makes every line
recorded exactly once across reconnects, rotations and restarts (pure)."""

from __future__ import annotations

import pytest

from supervisord.daemon.backends.kubernetes.logs import LogCursor, LogDecoder, parse_timestamp

T0 = "2026-01-02T03:04:05.100000000Z"
T1 = "2026-01-02T03:04:05.200000000Z"
T2 = "2026-01-02T03:04:06.000000001Z"


def body(*lines: tuple[str, str]) -> bytes:
    return b"".join(f"{ts} {text}\n".encode() for ts, text in lines)


def test_parse_timestamp() -> None:
    assert parse_timestamp("1970-01-01T00:00:01Z") == 1_000_000_000
    assert parse_timestamp("1970-01-01T00:00:01.5Z") == 1_500_000_000
    assert parse_timestamp("1970-01-01T02:00:01.000000001+02:00") == 1_000_000_001
    for bad in ("loss=0.5", "1970-01-01T00:00:01.1234567891Z", "1970-01-01 00:00:01Z", "1970-01-01T00:00:01"):
        with pytest.raises(ValueError):
            parse_timestamp(bad)


def test_cursor_round_trip_and_since_time() -> None:
    cur = LogCursor.parse(f"{T1}#2")
    assert cur is not None and cur.ts == T1 and cur.n == 2
    assert cur.since_time() == "2026-01-02T03:04:05Z"
    assert LogCursor.parse(None) is None
    with pytest.raises(ValueError):
        LogCursor.parse("12345")


def test_positions_count_lines_with_the_same_timestamp() -> None:
    d = LogDecoder(None)
    got = d.feed(body((T0, "a"), (T1, "b"), (T1, "c"), (T2, "d")))
    assert got == [(f"{T0}#0", "a"), (f"{T1}#0", "b"), (f"{T1}#1", "c"), (f"{T2}#0", "d")]
    assert d.position() == LogCursor(T2, parse_timestamp(T2), 0)


def test_replay_from_the_second_skips_what_was_recorded_including_ties() -> None:
    # Recorded up to the first line at T1; the reconnect (sinceTime = the
    # second of T1) replays T0 and both T1 lines, then new ones.
    d = LogDecoder(LogCursor.parse(f"{T1}#0"))
    got = d.feed(body((T0, "a"), (T1, "b"), (T1, "c"), (T2, "d")))
    assert got == [(f"{T1}#1", "c"), (f"{T2}#0", "d")]
    assert d.skipped == 2


def test_identical_text_at_the_same_timestamp_is_not_merged() -> None:
    d = LogDecoder(LogCursor.parse(f"{T1}#0"))
    assert d.feed(body((T1, "same"), (T1, "same"))) == [(f"{T1}#1", "same")]


def test_rotation_gives_a_shorter_replay_with_only_new_lines() -> None:
    # After rotation the new file holds only later lines: all are new.
    d = LogDecoder(LogCursor.parse(f"{T1}#1"))
    assert d.feed(body((T2, "x"), (T2, "y"))) == [(f"{T2}#0", "x"), (f"{T2}#1", "y")]


def test_lines_stepping_back_in_time_after_catching_up_are_kept() -> None:
    d = LogDecoder(None)
    got = d.feed(body((T1, "out"), (T0, "err raced")))
    assert got == [(f"{T1}#0", "out"), (f"{T0}#0", "err raced")]
    assert d.position() == LogCursor(T1, parse_timestamp(T1), 0)


def test_partial_lines_wait_for_their_newline_or_the_end() -> None:
    d = LogDecoder(None)
    assert d.feed(f"{T0} hel".encode()) == []
    assert d.feed(b"lo\n" + f"{T1} tail-no-newline".encode()) == [(f"{T0}#0", "hello")]
    assert d.finish() == [(f"{T1}#0", "tail-no-newline")]
    assert d.finish() == []


def test_empty_lines_and_utf8() -> None:
    d = LogDecoder(None)
    assert d.feed(f"{T0} \n{T1} h\u00e9llo\r\n".encode()) == [(f"{T0}#0", ""), (f"{T1}#0", "h\u00e9llo")]


def test_a_replay_assigns_the_same_positions_again() -> None:
    lines = ((T0, "a"), (T1, "b"), (T1, "c"), (T2, "d"), (T2, "e"))
    first = LogDecoder(None).feed(body(*lines))
    for i, (pos, _) in enumerate(first):
        again = LogDecoder(LogCursor.parse(pos)).feed(body(*lines))
        assert again == first[i + 1 :]


def test_long_lines_are_split_into_64k_pieces_at_character_boundaries() -> None:
    from store import MAX_LINE_BYTES
    from supervisord.daemon.backends.kubernetes.logs import LogCursor, split_long_line

    ts = "2026-11-29T17:00:00.000000001Z"
    assert split_long_line(f"{ts}#0", "short") == [(f"{ts}#0", "short")]
    text = "é" * 70000  # 140,000 bytes of 2-byte characters
    pieces = split_long_line(f"{ts}#3", text)
    assert [p for p, _ in pieces] == [f"{ts}#3", f"{ts}#3/1", f"{ts}#3/2"]
    assert "".join(t for _, t in pieces) == text
    assert all(len(t.encode()) <= MAX_LINE_BYTES for _, t in pieces)
    # A piece's position resumes like its line's.
    cur = LogCursor.parse(pieces[-1][0])
    assert cur is not None and cur.n == 3 and cur.ts == ts
