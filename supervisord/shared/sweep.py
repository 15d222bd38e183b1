"""Sweeps and labels: the grammar of ``--sweep``, ``--max-parallel`` and
``--label`` (and the task keys ``sweep:``, ``max_parallel:``, ``labels:``),
the grid's expansion into runs, and what a sweep reference looks like.

Pure and light (no I/O, no click): the CLI checks its flags with it before
connecting and the daemon checks the request again with the same rules.
Every error is a :class:`TaskError` (exit 2) naming the flag or key.

A grid maps each key (an identifier) to its values (text, in order). Its
runs are the cartesian product, the last key varying fastest::

    expand({"lr": ["1e-4", "3e-4"], "seed": ["1", "2"]})
    -> [{"lr": "1e-4", "seed": "1"}, {"lr": "1e-4", "seed": "2"}, ...]
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from supervisord.shared.exceptions import TaskError, UsageError

__all__ = [
    "MAX_RUNS",
    "MIN_SWEEP_PREFIX",
    "SWEEP_ID_LENGTH",
    "SWEEP_ID_PATTERN",
    "check_grid",
    "check_handles",
    "check_labels",
    "check_max_parallel",
    "check_placeholders",
    "check_sweep_ref",
    "command_keys",
    "expand",
    "is_sweep_ref",
    "new_sweep_id",
    "param_env",
    "parse_labels",
    "parse_sweep_pairs",
    "run_name",
    "substitute",
]

#: The most runs one sweep may have.
MAX_RUNS: Final = 10_000
#: Characters in a sweep id: ``s`` and 11 lowercase hex characters.
SWEEP_ID_LENGTH: Final = 12
#: Fewest characters of a sweep id prefix (``s`` included).
MIN_SWEEP_PREFIX: Final = 5
#: A full sweep id as a regular expression.
SWEEP_ID_PATTERN: Final = r"^s[0-9a-f]{11}$"

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_RANGE = re.compile(r"^\s*(-?\d+)\s*\.\.\s*(-?\d+)\s*$")
# {key} in a command, but not ${key} (bash's own parameter expansion).
_PLACEHOLDER = re.compile(r"(?<!\$)\{([A-Za-z_][A-Za-z0-9_]*)\}")
_LABEL_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-/]{0,62}$")
_MAX_LABELS = 64
_MAX_LABEL_VALUE = 256
_MAX_VALUE = 256


def new_sweep_id() -> str:
    """A fresh sweep id: ``s`` and 11 random lowercase hex characters."""
    import secrets  # only the daemon makes ids: the CLI's fast path stays light

    return "s" + secrets.token_hex(6)[:11]


def is_sweep_ref(ref: str) -> bool:
    """True when ``ref`` (any case, blanks around it ignored) is a sweep id
    or a prefix of one of :data:`MIN_SWEEP_PREFIX`+ characters. A run id
    (hex only) never is."""
    ref = ref.strip().lower()
    return (
        MIN_SWEEP_PREFIX <= len(ref) <= SWEEP_ID_LENGTH
        and ref[0] == "s"
        and all(c in "0123456789abcdef" for c in ref[1:])
    )


def check_sweep_ref(ref: str) -> str:
    """``ref`` normalized (stripped, lowercased). Raises UsageError when it
    is not a sweep id or a prefix of 5+ characters."""
    norm = ref.strip().lower()
    if not is_sweep_ref(norm):
        raise UsageError(
            f"sweep id {norm!r}: give the sweep id (s and 11 hex characters) or a unique prefix of "
            f"{MIN_SWEEP_PREFIX}+ characters"
        )
    return norm


def check_handles(refs: Iterable[str]) -> None:
    """Check run references that may also be sweep ids (``wait``,
    ``cancel``, ``hold``, ``release``): as
    :func:`supervisord.shared.runref.check_run_refs`, a sweep reference being
    valid too. Raises one UsageError naming each malformed one."""
    from supervisord.shared.runref import check_run_ref

    refs = list(refs)
    bad: list[str] = []
    for ref in refs:
        if is_sweep_ref(ref):
            continue
        try:
            check_run_ref(ref)
        except UsageError as err:
            bad.append(f"{err} (or a sweep id: s and 11 hex characters, or a prefix of {MIN_SWEEP_PREFIX}+)")
    if bad:
        raise UsageError("; ".join(bad) + ("" if len(refs) == 1 else "; nothing was done"))


def _values_of(raw: str, what: str) -> list[str]:
    """The values ``V1,V2,...`` or ``A..B`` (an inclusive integer range)."""
    m = _RANGE.match(raw)
    if m:
        lo, hi = int(m.group(1)), int(m.group(2))
        if lo > hi:
            raise TaskError(f"{what}: the range {raw.strip()} is empty (it must go up: {hi}..{lo})")
        if hi - lo >= MAX_RUNS:
            raise TaskError(f"{what}: the range {raw.strip()} has more than {MAX_RUNS} values")
        return [str(i) for i in range(lo, hi + 1)]
    if not raw.strip():
        raise TaskError(f"{what}: the value list is empty")
    return [v.strip() for v in raw.split(",")]


def _check_values(key: str, values: Sequence[str], what: str) -> list[str]:
    if not values:
        raise TaskError(f"{what}: the value list of {key!r} is empty")
    seen: set[str] = set()
    for v in values:
        if not v:
            raise TaskError(f"{what}: {key!r} has an empty value")
        if len(v) > _MAX_VALUE:
            raise TaskError(f"{what}: a value of {key!r} is {len(v)} characters long; at most {_MAX_VALUE}")
        if any(not c.isprintable() for c in v):
            raise TaskError(f"{what}: a value of {key!r} holds a control character")
        if v in seen:
            raise TaskError(f"{what}: {key!r} lists the value {v!r} twice")
        seen.add(v)
    return list(values)


def _check_key(key: Any, what: str, seen: Mapping[str, Any]) -> str:
    if not isinstance(key, str) or not _KEY.match(key):
        raise TaskError(
            f"{what}: {str(key)[:64]!r} is not a valid key (letters, digits and _, not starting with a digit)"
        )
    if key.upper() in {k.upper() for k in seen}:
        raise TaskError(f"{what}: the key {key!r} is given twice (keys must differ in more than case)")
    return key


def parse_sweep_pairs(pairs: Iterable[str], *, what: str = "--sweep") -> dict[str, list[str]]:
    """The grid of ``--sweep KEY=V1,V2,...`` / ``--sweep KEY=A..B`` flags,
    in their order. Raises TaskError naming the flag and the bad part."""
    grid: dict[str, list[str]] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep:
            raise TaskError(f"{what} {pair!r}: use KEY=V1,V2,... or KEY=A..B")
        key = _check_key(key.strip(), f"{what} {pair!r}", grid)
        grid[key] = _check_values(key, _values_of(raw, f"{what} {key}"), f"{what} {key}")
    _check_size(grid, what)
    return grid


def check_grid(grid: Any, *, what: str = "sweep") -> dict[str, list[str]]:
    """A grid as a request or task file gives it (``{KEY: [values...]}``,
    a value list may also be ``"V1,V2"`` or ``"A..B"`` text), checked and
    with every value as text. Raises TaskError naming ``what``."""
    if not isinstance(grid, Mapping) or not grid:
        raise TaskError(f"{what}: must map each key to a non-empty list of values")
    out: dict[str, list[str]] = {}
    for key, raw in grid.items():
        key = _check_key(key, what, out)
        if isinstance(raw, str):
            values = _values_of(raw, f"{what}.{key}")
        elif isinstance(raw, list):
            values = []
            for v in raw:
                if isinstance(v, bool) or not isinstance(v, (str, int, float)):
                    raise TaskError(f"{what}.{key}: values must be text or numbers, got {v!r:.40}")
                values.append(str(v).strip())
        elif isinstance(raw, (int, float)) and not isinstance(raw, bool):
            values = [str(raw)]
        else:
            raise TaskError(f"{what}.{key}: must be a list of values, got {raw!r:.40}")
        out[key] = _check_values(key, values, f"{what}.{key}")
    _check_size(out, what)
    return out


def _check_size(grid: Mapping[str, Sequence[str]], what: str) -> None:
    count = 1
    for values in grid.values():
        count *= len(values)
    if count > MAX_RUNS:
        sizes = " x ".join(str(len(v)) for v in grid.values())
        raise TaskError(f"{what}: the grid has {count} runs ({sizes}); a sweep has at most {MAX_RUNS}")


def check_max_parallel(value: Any, *, what: str = "--max-parallel") -> int | None:
    """``max_parallel``: None, or a whole number in 1..:data:`MAX_RUNS`."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TaskError(f"{what}: must be a whole number of runs, got {value!r}")
    if not 1 <= value <= MAX_RUNS:
        raise TaskError(f"{what}: must be in 1..{MAX_RUNS}, got {value}")
    return value


def expand(grid: Mapping[str, Sequence[str]]) -> list[dict[str, str]]:
    """The grid's runs: every combination of values, the last key varying fastest."""
    keys = list(grid)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(grid[k] for k in keys))]


def command_keys(text: str) -> list[str]:
    """The ``{key}`` placeholders in ``text`` in order of first use
    (``${key}``, bash's own, is not one)."""
    return list(dict.fromkeys(_PLACEHOLDER.findall(text)))


def substitute(text: str, params: Mapping[str, str]) -> str:
    """``text`` with each ``{key}`` of ``params`` replaced by its value."""
    return _PLACEHOLDER.sub(lambda m: params.get(m.group(1), m.group(0)), text)


def check_placeholders(
    command: str, name: str | None, grid: Mapping[str, Sequence[str]], *, what: str = "--sweep"
) -> list[str]:
    """Every ``{key}`` of the command and name must be a grid key (else
    TaskError); a grid key neither uses is a warning (returned)."""
    used = command_keys(command) + command_keys(name or "")
    unknown = [k for k in dict.fromkeys(used) if k not in grid]
    if unknown:
        shown = ", ".join("{" + k + "}" for k in unknown)
        raise TaskError(f"{shown}: the command uses it but no {what} defines it (have: {', '.join(grid)})")
    return [
        f"{what} {k}: the command never uses {{{k}}} (the run gets it as $JOBSUP_PARAM_{k.upper()} only)"
        for k in grid
        if k not in used
    ]


def run_name(base: str, params: Mapping[str, str]) -> str:
    """A sweep run's name: ``base`` with its ``{key}`` placeholders
    replaced when it has any, else ``base[k=v,...]``."""
    if command_keys(base):
        return substitute(base, params)
    return f"{base}[{','.join(f'{k}={v}' for k, v in params.items())}]"


def param_env(params: Mapping[str, str], sweep_id: str, index: int) -> dict[str, str]:
    """The variables a sweep run gets: ``JOBSUP_PARAM_<KEY>`` (upper-cased),
    ``JOBSUP_SWEEP_ID`` and ``JOBSUP_SWEEP_INDEX`` (0-based)."""
    env = {f"JOBSUP_PARAM_{k.upper()}": v for k, v in params.items()}
    env["JOBSUP_SWEEP_ID"] = sweep_id
    env["JOBSUP_SWEEP_INDEX"] = str(index)
    return env


def _check_label(key: Any, value: Any, what: str) -> tuple[str, str]:
    if not isinstance(key, str) or not _LABEL_KEY.match(key):
        raise TaskError(
            f"{what}: {str(key)[:64]!r} is not a label key (1-63 letters, digits, '_', '.', '-', '/', "
            "starting with a letter or digit)"
        )
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise TaskError(f"{what}: the label {key!r} must have a text value")
    text = str(value)
    if len(text) > _MAX_LABEL_VALUE or any(not c.isprintable() for c in text):
        raise TaskError(
            f"{what}: the value of label {key!r} must be printable text of at most {_MAX_LABEL_VALUE} characters"
        )
    return key, text


def parse_labels(pairs: Iterable[str], *, what: str = "--label") -> dict[str, str]:
    """``--label K=V`` flags as a mapping (a key given twice: the last wins
    is not silent, it is an error)."""
    labels: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise TaskError(f"{what} {pair!r}: use KEY=VALUE")
        if key in labels:
            raise TaskError(f"{what}: the label {key!r} is given twice")
        k, v = _check_label(key, value, what)
        labels[k] = v
    if len(labels) > _MAX_LABELS:
        raise TaskError(f"{what}: at most {_MAX_LABELS} labels")
    return labels


def check_labels(labels: Any, *, what: str = "labels") -> dict[str, str]:
    """A ``labels`` mapping from a request or task file, checked; {} for None."""
    if labels is None:
        return {}
    if not isinstance(labels, Mapping):
        raise TaskError(f"{what}: must map label keys to text values")
    if len(labels) > _MAX_LABELS:
        raise TaskError(f"{what}: at most {_MAX_LABELS} labels")
    return dict(_check_label(k, v, what) for k, v in labels.items())
