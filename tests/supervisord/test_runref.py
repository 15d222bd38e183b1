"""The one run-reference rule (supervisord.runref) the daemon and the CLI share."""

from __future__ import annotations

import re

import pytest

from supervisord.exceptions import UsageError
from supervisord.runref import RUN_REF_HINT, check_run_ref, check_run_refs


@pytest.mark.parametrize(("ref", "norm"), [("abcd", "abcd"), (" ABCDEF012345 ", "abcdef012345"), ("0000", "0000")])
def test_accepts_4_to_12_hex_any_case(ref: str, norm: str) -> None:
    assert check_run_ref(ref) == norm


@pytest.mark.parametrize("ref", ["", "abc", "zzzz", "abcd-", "abcdef0123456", "g123"])
def test_rejects_anything_else_with_the_hint(ref: str) -> None:
    with pytest.raises(UsageError, match=re.escape(RUN_REF_HINT)):
        check_run_ref(ref)


def test_several_refs_name_every_bad_one_and_say_nothing_was_done() -> None:
    with pytest.raises(UsageError) as err:
        check_run_refs(["abcd", "xy", "zzzz"])
    assert str(err.value) == (f"run id 'xy': {RUN_REF_HINT}; run id 'zzzz': {RUN_REF_HINT}; nothing was done")
    check_run_refs(["abcd", "ABCDEF012345"])
