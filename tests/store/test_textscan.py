"""store._accel: the C accelerator (store/_accel/_textscan.c) and the bytes-method
fallback give the same answers, and split_block's line count is the text's."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys

import pytest

import store._accel as scan_mod
from store import split_block, split_lines
from store._accel import count_newlines, scan

_ALPHABET = b"ab\n\r\xc3\xa9\x00\x7f\xff"


def _texts(seed: int) -> list[bytes]:
    rnd = random.Random(seed)
    out = [b"", b"\n", b"\r", b"a" * 100_000, b"\n" * 70_000, b"\xff", b"x\r\ny\n"]
    for _ in range(60):
        size = rnd.choice([1, 15, 16, 17, 4079, 4080, 4081, 32767, 32768, 32769, 65536 + 3, rnd.randrange(200_000)])
        weights = [rnd.random() for _ in _ALPHABET]
        out.append(bytes(rnd.choices(_ALPHABET, weights, k=size)))
    return out


def _fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scan_mod, "_c", None)


@pytest.mark.parametrize("seed", range(3))
def test_scan_matches_the_bytes_methods(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    for text in _texts(seed):
        for window in (1, 16, 4080, 32768):
            bare = sum(1 for k in range(0, len(text) - window + 1, window) if b"\n" not in text[k : k + window])
            expected = (text.count(b"\n"), b"\r" in text, text.isascii(), bare)
            assert scan(text, window) == expected, (len(text), window)
    _fallback(monkeypatch)
    for text in _texts(seed):
        bare = sum(1 for k in range(0, len(text) - 32768 + 1, 32768) if b"\n" not in text[k : k + 32768])
        assert scan(text, 32768) == (text.count(b"\n"), b"\r" in text, text.isascii(), bare)


def test_count_newlines_of_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    rnd = random.Random(7)
    for text in _texts(7):
        for _ in range(5):
            start = rnd.randrange(len(text) + 1)
            end = rnd.choice([None, rnd.randrange(start, len(text) + 2)])
            want = text.count(b"\n", start, len(text) if end is None else end)
            assert count_newlines(text, start, end) == want
            with monkeypatch.context() as m:
                m.setattr(scan_mod, "_c", None)
                assert count_newlines(text, start, end) == want


def test_scan_refuses_a_window_of_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="window must be > 0"):
        scan(b"a\n", 0)
    _fallback(monkeypatch)
    with pytest.raises(ValueError, match="window must be > 0"):
        scan(b"a\n", 0)


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler: the fallback")
def test_the_accelerator_is_built_where_a_compiler_is() -> None:
    """pip install builds it where a C compiler is (as on CI): it must then
    be in use (the fallback costs several times the CPU, see setup.py),
    unless ``JOBSUP_STORE_NO_ACCEL`` asks for the fallback (tests/ci.py)."""
    forced_off = os.environ.get("JOBSUP_STORE_NO_ACCEL", "") not in ("", "0")
    assert scan_mod.ACCELERATED is not forced_off


def test_the_fallback_can_be_forced() -> None:
    code = "import store._accel as a; print(a.ACCELERATED)"
    env = {**os.environ, "JOBSUP_STORE_NO_ACCEL": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize("accelerated", [True, False])
def test_split_block_counts_the_lines_it_splits(accelerated: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if not accelerated:
        _fallback(monkeypatch)
    rnd = random.Random(11)
    for text in _texts(11):
        block, consumed = split_block(text, 1000, rnd.random() < 0.3, "stdout", "stdout")
        if block is None:
            continue
        assert block.lines is None or block.lines == block.text.count(b"\n")
        lines, consumed_lines = split_lines(text, 1000, False)
        if block.start is not None:  # the clean case: the text as it is, counted once
            assert block.lines == len(block.text.splitlines()) == block.text.count(b"\n")
            assert consumed == consumed_lines and block.lines == len(lines)
