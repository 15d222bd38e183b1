"""split_lines: positions, partial lines, overlong lines, binary, CRLF, UTF-8."""

from __future__ import annotations

import random

import pytest

from store import MAX_LINE_BYTES, split_lines


def feed(data: bytes, chunk_sizes: list[int]) -> list[tuple[str, str]]:
    """Tail ``data`` the way a backend does: read chunks, keep the
    unconsumed rest, call with final=True at the end."""
    out: list[tuple[str, str]] = []
    offset, pending, i = 0, b"", 0
    for size in chunk_sizes:
        pending += data[i : i + size]
        i += size
        lines, consumed = split_lines(pending, offset, final=False)
        out += lines
        offset += consumed
        pending = pending[consumed:]
    pending += data[i:]
    lines, consumed = split_lines(pending, offset, final=True)
    assert consumed == len(pending)
    return out + lines


def test_lines_carry_the_offset_after_their_newline() -> None:
    assert split_lines(b"a\nbb\n\nccc\n", 100, final=False) == (
        [("102", "a"), ("105", "bb"), ("106", ""), ("110", "ccc")],
        10,
    )


def test_incomplete_last_line_waits_unless_final() -> None:
    assert split_lines(b"a\nhalf", 0, final=False) == ([("2", "a")], 2)
    assert split_lines(b"a\nhalf", 0, final=True) == ([("2", "a"), ("6", "half")], 6)
    assert split_lines(b"", 7, final=True) == ([], 0)
    assert split_lines(b"no newline yet", 0, final=False) == ([], 0)


def test_crlf_loses_its_cr_but_a_lone_cr_stays() -> None:
    assert split_lines(b"dos\r\nprogress\r50%\n\r\n", 0, final=False) == (
        [("5", "dos"), ("18", "progress\r50%"), ("20", "")],
        20,
    )


def test_binary_output_is_decoded_with_replacement() -> None:
    data = bytes(range(256)) * 4 + b"\xff\xfe\x00tail"
    lines, consumed = split_lines(data, 0, final=True)
    assert consumed == len(data)
    assert len(lines) == 5  # four b"\n" inside range(256), then the unterminated tail
    assert [int(pos) for pos, _ in lines] == [11, 267, 523, 779, len(data)]
    assert lines[1][1].startswith("\x0b\x0c\r\x0e") and "\ufffd" in lines[1][1]
    assert lines[4][1].endswith("\ufffd\ufffd\x00tail")


def test_overlong_line_is_split_never_dropped() -> None:
    line = b"x" * (2 * MAX_LINE_BYTES + 10)
    lines, consumed = split_lines(line + b"\nnext\n", 1000, final=False)
    assert [(pos, len(text)) for pos, text in lines] == [
        (str(1000 + MAX_LINE_BYTES), MAX_LINE_BYTES),
        (str(1000 + 2 * MAX_LINE_BYTES), MAX_LINE_BYTES),
        (str(1000 + len(line) + 1), 10),
        (str(1000 + len(line) + 6), 4),
    ]
    assert "".join(t for _, t in lines[:3]) == line.decode()
    assert consumed == len(line) + 6


def test_overlong_line_without_newline_is_emitted_even_if_not_final() -> None:
    lines, consumed = split_lines(b"y" * (MAX_LINE_BYTES + 5), 0, final=False)
    assert lines == [(str(MAX_LINE_BYTES), "y" * MAX_LINE_BYTES)] and consumed == MAX_LINE_BYTES
    # exactly 64 KiB with no newline yet may still be a complete line: wait
    assert split_lines(b"y" * MAX_LINE_BYTES, 0, final=False) == ([], 0)
    assert split_lines(b"y" * MAX_LINE_BYTES + b"\n", 0, final=False) == (
        [(str(MAX_LINE_BYTES + 1), "y" * MAX_LINE_BYTES)],
        MAX_LINE_BYTES + 1,
    )


@pytest.mark.parametrize(("char", "shift"), [("é", 1), ("€", 1), ("€", 2), ("😀", 1), ("😀", 2), ("😀", 3)])
def test_a_cut_never_splits_a_utf8_sequence(char: str, shift: int) -> None:
    prefix = b"a" * (MAX_LINE_BYTES - shift)  # the character starts `shift` bytes before the cut
    lines, _ = split_lines(prefix + char.encode() + b"b" * 10 + b"\n", 0, final=False)
    assert [text for _, text in lines] == ["a" * (MAX_LINE_BYTES - shift), char + "b" * 10]
    assert lines[0][0] == str(MAX_LINE_BYTES - shift)


def test_utf8_split_across_reads_is_decoded_whole() -> None:
    data = "naïve ☃ line\n".encode()
    for cut in range(1, len(data)):
        assert feed(data, [cut]) == [(str(len(data)), "naïve ☃ line")]


def test_result_does_not_depend_on_how_the_file_was_read() -> None:
    rng = random.Random(5)
    parts = []
    for _ in range(300):
        kind = rng.random()
        if kind < 0.6:
            parts.append(f"line {rng.random()} ünïcödé ☃ 😀".encode() + rng.choice([b"\n", b"\r\n"]))
        elif kind < 0.7:
            parts.append(rng.randbytes(rng.randint(1, 300)))
        elif kind < 0.75:
            parts.append("é€😀".encode() * rng.randint(20_000, 40_000) + b"\n")  # overlong, multibyte
        else:
            parts.append(b"\n")
    data = b"".join(parts) + b"\nunterminated tail"
    whole = feed(data, [])
    assert whole[-1] == (str(len(data)), "unterminated tail")
    assert int(whole[-1][0]) == len(data) and all(int(a[0]) < int(b[0]) for a, b in zip(whole, whole[1:]))
    for _ in range(20):
        sizes = [rng.choice([1, 7, 100, 4096, 70_000]) for _ in range(len(data) // 3000)]
        assert feed(data, sizes) == whole


@pytest.mark.parametrize("text", ["", "short", "y" * 200000, "é" * 70000, "a" + "😀" * 40000])
def test_split_text_cuts_like_split_lines(text: str) -> None:
    from store import split_text

    pieces = split_text(text)
    assert "".join(pieces) == text
    assert [t for _, t in split_lines(text.encode(), 0, True)[0]] == (pieces if text else [])
