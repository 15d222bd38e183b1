"""What a run reference (a run id or a prefix of one) must look like: the
one rule the daemon (:func:`supervisord.daemon.readside.resolve_run_id`), task
options (``depends_on``) and the CLI (before it connects) all apply.

Pure and light: the CLI's fast path imports it (no click, no store).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from supervisord.shared.exceptions import UsageError

__all__ = [
    "MIN_PREFIX",
    "RUN_ID_LENGTH",
    "RUN_ID_PATTERN",
    "RUN_REF_HINT",
    "RUN_REF_PATTERN",
    "check_run_ref",
    "check_run_refs",
    "is_run_ref",
    "normalize_run_ref",
    "run_id_schema",
    "run_ref_schema",
]

#: Hex characters in a full run id (``secrets.token_hex(6)``).
RUN_ID_LENGTH: Final = 12
#: Fewest characters a run id prefix may have.
MIN_PREFIX: Final = 4
#: What the error for a malformed reference tells the user to give.
RUN_REF_HINT: Final = f"give the {RUN_ID_LENGTH}-hex-character run id or a unique prefix of {MIN_PREFIX}+ characters"
#: A (normalized) run reference as a regular expression: what
#: :func:`is_run_ref` accepts.
RUN_REF_PATTERN: Final = f"^[0-9a-f]{{{MIN_PREFIX},{RUN_ID_LENGTH}}}$"
#: A full run id as a regular expression.
RUN_ID_PATTERN: Final = f"^[0-9a-f]{{{RUN_ID_LENGTH}}}$"

_HEX = frozenset("0123456789abcdef")


def normalize_run_ref(ref: str) -> str:
    """``ref`` stripped of surrounding blanks and lowercased (ids are
    accepted in any case)."""
    return ref.strip().lower()


def is_run_ref(ref: str) -> bool:
    """True when ``ref`` (normalized: :func:`normalize_run_ref`) is 4 to 12
    hex characters: a run id or a prefix of one."""
    return MIN_PREFIX <= len(ref) <= RUN_ID_LENGTH and all(c in _HEX for c in ref)


def run_ref_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a run reference, from this
    module's rule (the MCP tools' inputs): a string of :data:`MIN_PREFIX`
    to :data:`RUN_ID_LENGTH` lowercase hex characters, with a description
    that says so. A fresh dict each call."""
    return {
        "type": "string",
        "pattern": RUN_REF_PATTERN,
        "minLength": MIN_PREFIX,
        "maxLength": RUN_ID_LENGTH,
        "description": (
            f"a run id ({RUN_ID_LENGTH} lowercase hex characters) or a unique prefix of one: "
            f"{MIN_PREFIX} to {RUN_ID_LENGTH} lowercase hex characters (0-9, a-f)"
        ),
    }


def run_id_schema() -> dict[str, Any]:
    """The JSON Schema of a full run id: :data:`RUN_ID_LENGTH` lowercase
    hex characters. A fresh dict each call."""
    return {
        "type": "string",
        "pattern": RUN_ID_PATTERN,
        "minLength": RUN_ID_LENGTH,
        "maxLength": RUN_ID_LENGTH,
        "description": f"a run id: {RUN_ID_LENGTH} lowercase hex characters (0-9, a-f)",
    }


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
