"""What a run reference (a run id or a prefix of one) must look like: the
one rule the daemon (:func:`supervisord.readside.resolve_run_id`), task
options (``depends_on``) and the CLI (before it connects) all apply.

Pure and light: the CLI's fast path imports it (no click, no store).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from supervisord.exceptions import UsageError

__all__ = ["RUN_ID_LENGTH", "RUN_REF_HINT", "check_run_ref", "check_run_refs", "is_run_ref", "normalize_run_ref"]

#: Hex characters in a full run id (``secrets.token_hex(6)``).
RUN_ID_LENGTH: Final = 12
#: Fewest characters a run id prefix may have.
MIN_PREFIX: Final = 4
#: What the error for a malformed reference tells the user to give.
RUN_REF_HINT: Final = "give the 12-hex-character run id or a unique prefix of 4+ characters"

_HEX = frozenset("0123456789abcdef")


def normalize_run_ref(ref: str) -> str:
    """``ref`` stripped of surrounding blanks and lowercased (ids are
    accepted in any case)."""
    return ref.strip().lower()


def is_run_ref(ref: str) -> bool:
    """True when ``ref`` (normalized: :func:`normalize_run_ref`) is 4 to 12
    hex characters: a run id or a prefix of one."""
    return MIN_PREFIX <= len(ref) <= RUN_ID_LENGTH and all(c in _HEX for c in ref)


def check_run_ref(ref: str) -> str:
    """``ref`` normalized (:func:`normalize_run_ref`). Raises UsageError
    ``run id 'REF': give the 12-hex-character run id ...`` when it is not
    4 to 12 hex characters."""
    norm = normalize_run_ref(ref)
    if not is_run_ref(norm):
        raise UsageError(f"run id {norm!r}: {RUN_REF_HINT}")
    return norm


def check_run_refs(refs: Iterable[str]) -> None:
    """Check every one of ``refs`` with :func:`check_run_ref`. Raises one
    UsageError naming each malformed one (``; ``-joined, then ``; nothing
    was done`` when several refs were given), so a command on several runs
    rejects them before doing anything."""
    refs = list(refs)
    bad: list[str] = []
    for ref in refs:
        try:
            check_run_ref(ref)
        except UsageError as err:
            bad.append(str(err))
    if bad:
        raise UsageError("; ".join(bad) + ("" if len(refs) == 1 else "; nothing was done"))
