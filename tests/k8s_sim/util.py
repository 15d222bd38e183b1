"""Small pure helpers shared by the simulator: times, Status objects, selectors,
``$(VAR)`` expansion and patches.

Every rule here copies a documented Kubernetes behaviour; each function names the
source it follows.
"""

from __future__ import annotations

import copy
import json
import re
import secrets
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

JSON = dict[str, Any]
"""A JSON object as decoded by :func:`json.loads`."""


class SimError(Exception):
    """The simulator itself was used wrongly (bad knob value, bad seed object).

    ``str()`` names the argument or value at fault.
    """


class ApiError(Exception):
    """An HTTP error answer of the simulated API server.

    ``status`` is a ``metav1.Status`` object (see :func:`status_failure`);
    ``headers`` are extra response headers (``Retry-After``).
    """

    def __init__(self, status: JSON, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(f"{status.get('code')} {status.get('reason')}: {status.get('message')}")
        self.status = status
        self.headers: dict[str, str] = dict(headers or {})

    @property
    def code(self) -> int:
        """The HTTP status code, e.g. 404."""
        return int(self.status["code"])


# --------------------------------------------------------------------------- time


def rfc3339(ts: float | None = None) -> str:
    """``metav1.Time`` wire form: RFC 3339 in UTC with second precision, e.g.
    ``2024-05-01T10:00:00Z`` (metav1.Time.MarshalJSON truncates to seconds)."""
    t = time.time() if ts is None else ts
    return datetime.fromtimestamp(int(t), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339_micro(ts: float | None = None) -> str:
    """``metav1.MicroTime`` wire form (Event.eventTime): six fractional digits."""
    t = time.time() if ts is None else ts
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _zone(offset_s: int) -> str:
    if offset_s == 0:
        return "Z"
    sign = "+" if offset_s > 0 else "-"
    hours, minutes = divmod(abs(offset_s) // 60, 60)
    return f"{sign}{hours:02d}:{minutes:02d}"


def rfc3339_nano(ts_ns: int, offset_s: int = 0) -> str:
    """The kubelet's log timestamp: ``RFC3339NanoFixed``
    (``2006-01-02T15:04:05.000000000Z07:00``, always nine fractional digits),
    as written by pkg/kubelet/kuberuntime/logs for ``timestamps=true``; in the
    zone ``offset_s`` seconds east of UTC (the kubelet keeps the zone the
    runtime wrote the record in: ``Z`` for UTC, else ``+01:00``...)."""
    secs, nanos = divmod(ts_ns, 1_000_000_000)
    local = datetime.fromtimestamp(secs + offset_s, UTC)
    return local.strftime("%Y-%m-%dT%H:%M:%S") + f".{nanos:09d}" + _zone(offset_s)


def rfc3339_nano_go(ts_ns: int, offset_s: int = 0) -> str:
    """Go's ``time.RFC3339Nano`` (trailing zeros of the fraction dropped, no
    fraction when it is zero), as the runtimes write CRI log records; in the
    zone ``offset_s`` seconds east of UTC."""
    secs, nanos = divmod(ts_ns, 1_000_000_000)
    local = datetime.fromtimestamp(secs + offset_s, UTC)
    frac = f"{nanos:09d}".rstrip("0")
    return local.strftime("%Y-%m-%dT%H:%M:%S") + (f".{frac}" if frac else "") + _zone(offset_s)


_RFC3339_RE = re.compile(r"^(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?(Z|z|[+-]\d{2}:\d{2})$")


def parse_rfc3339_ns(text: str) -> int:
    """Parse an RFC 3339 time (any fraction up to nanoseconds) into Unix nanoseconds.

    Raises ValueError naming the text when it is not RFC 3339.
    """
    m = _RFC3339_RE.match(text.strip())
    if not m:
        raise ValueError(f"not an RFC 3339 time: {text!r}")
    year, month, day, hour, minute, second, frac, zone = m.groups()
    dt = datetime(int(year), int(month), int(day), int(hour), int(minute), int(second), tzinfo=UTC)
    secs = int(dt.timestamp())
    if zone not in ("Z", "z"):
        sign = 1 if zone[0] == "+" else -1
        secs -= sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    nanos = int((frac or "0").ljust(9, "0"))
    return secs * 1_000_000_000 + nanos


def random_suffix(n: int = 5) -> str:
    """A ``generateName`` suffix: ``n`` characters from the apiserver's alphabet
    (k8s.io/apimachinery/pkg/util/rand: consonants and digits without look-alikes)."""
    alphabet = "bcdfghjklmnpqrstvwxz2456789"
    return "".join(secrets.choice(alphabet) for _ in range(n))


def clone(obj: Any) -> Any:
    """A deep copy of a JSON value (objects in the store are never mutated in place)."""
    return copy.deepcopy(obj)


def dumps(obj: Any) -> bytes:
    """Compact JSON bytes, the way the apiserver encodes responses."""
    return json.dumps(obj, separators=(",", ":")).encode()


# ------------------------------------------------------------------------- Status


def status_failure(
    code: int,
    reason: str,
    message: str,
    details: JSON | None = None,
) -> JSON:
    """A ``metav1.Status`` failure object, shaped like the apiserver's
    (k8s.io/apimachinery/pkg/api/errors): kind, apiVersion, metadata, status,
    message, reason, details (when given), code."""
    out: JSON = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
    }
    if details is not None:
        out["details"] = details
    out["code"] = code
    return out


def status_success(details: JSON | None = None) -> JSON:
    """A ``metav1.Status`` success object (DELETE of an object that is gone at once)."""
    out: JSON = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}
    if details is not None:
        out["details"] = details
    return out


def err_not_found(qualified: str, name: str, group: str, plural: str) -> ApiError:
    """404 NotFound: ``jobs.batch "x" not found`` (errors.NewNotFound)."""
    return ApiError(
        status_failure(
            404,
            "NotFound",
            f'{qualified} "{name}" not found',
            {"name": name, "group": group, "kind": plural} if group else {"name": name, "kind": plural},
        )
    )


def err_already_exists(qualified: str, name: str, group: str, plural: str) -> ApiError:
    """409 AlreadyExists: ``jobs.batch "x" already exists`` (errors.NewAlreadyExists)."""
    details: JSON = {"name": name, "kind": plural}
    if group:
        details["group"] = group
    return ApiError(status_failure(409, "AlreadyExists", f'{qualified} "{name}" already exists', details))


def err_conflict(qualified: str, name: str, group: str, plural: str) -> ApiError:
    """409 Conflict on a stale resourceVersion (errors.NewConflict with
    registry.OptimisticLockErrorMsg)."""
    details: JSON = {"name": name, "kind": plural}
    if group:
        details["group"] = group
    return ApiError(
        status_failure(
            409,
            "Conflict",
            f'Operation cannot be fulfilled on {qualified} "{name}": the object has been modified; '
            "please apply your changes to the latest version and try again",
            details,
        )
    )


def err_invalid(kind: str, group: str, name: str, causes: list[JSON]) -> ApiError:
    """422 Invalid (errors.NewInvalid): ``Job.batch "x" is invalid: <field>: <msg>, ...``.

    ``causes`` are ``{"reason", "message", "field"}`` rows (metav1.StatusCause).
    """
    qualified_kind = f"{kind}.{group}" if group else kind
    parts = [f"{c['field']}: {c['message']}" for c in causes]
    joined = parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
    details: JSON = {"name": name, "kind": kind, "causes": causes}
    if group:
        details["group"] = group
    return ApiError(status_failure(422, "Invalid", f'{qualified_kind} "{name}" is invalid: {joined}', details))


def err_bad_request(message: str) -> ApiError:
    """400 BadRequest (errors.NewBadRequest)."""
    return ApiError(status_failure(400, "BadRequest", message))


def cause(reason: str, field: str, message: str) -> JSON:
    """One ``metav1.StatusCause`` for :func:`err_invalid`."""
    return {"reason": reason, "message": message, "field": field}


# --------------------------------------------------------------------- selectors

Predicate = Callable[[Mapping[str, str]], bool]


def _split_top(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    parts: list[str] = []
    depth = 0
    cur = ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


_SET_RE = re.compile(r"^([A-Za-z0-9./_-]+)\s+(in|notin)\s+\(([^)]*)\)$")
_EQ_RE = re.compile(r"^([A-Za-z0-9./_-]+)\s*(==|=|!=)\s*([A-Za-z0-9._-]*)$")
_EXISTS_RE = re.compile(r"^(!?)\s*([A-Za-z0-9./_-]+)$")


def parse_label_selector(text: str | None) -> Predicate:
    """Compile a ``labelSelector`` query string into a predicate over labels.

    Grammar of k8s.io/apimachinery/pkg/labels.Parse: comma-separated requirements
    ``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``, ``k notin (a)``, ``k``, ``!k``.
    Raises ApiError 400 naming the requirement that does not parse.
    """
    if not text or not text.strip():
        return lambda labels: True
    reqs: list[tuple[str, str, frozenset[str]]] = []
    for part in _split_top(text):
        m = _SET_RE.match(part)
        if m:
            key, op, values_text = m.groups()
            reqs.append((key, op, frozenset(v.strip() for v in values_text.split(",") if v.strip())))
            continue
        m = _EQ_RE.match(part)
        if m:
            key, op, value = m.groups()
            reqs.append((key, "notin" if op == "!=" else "in", frozenset({value})))
            continue
        m = _EXISTS_RE.match(part)
        if m:
            neg, key = m.groups()
            reqs.append((key, "!exists" if neg else "exists", frozenset()))
            continue
        raise err_bad_request(f"unable to parse requirement: {part!r} in labelSelector {text!r}")

    def match(labels: Mapping[str, str]) -> bool:
        for key, op, values in reqs:
            if op == "in" and labels.get(key) not in values:
                return False
            if op == "notin" and labels.get(key) in values:
                return False
            if op == "exists" and key not in labels:
                return False
            if op == "!exists" and key in labels:
                return False
        return True

    return match


def match_selector_object(selector: JSON | None, labels: Mapping[str, str]) -> bool:
    """Match a ``metav1.LabelSelector`` object (matchLabels + matchExpressions with
    In, NotIn, Exists, DoesNotExist). A null selector matches nothing, an empty one
    matches everything (metav1.LabelSelectorAsSelector)."""
    if selector is None:
        return False
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], set(expr.get("values") or [])
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def parse_field_selector(text: str | None, known: frozenset[str]) -> list[tuple[str, bool, str]]:
    """Parse a ``fieldSelector`` (``a=b``, ``a==b``, ``a!=b``, comma-separated) into
    ``(field, equal, value)`` rows. A field outside ``known`` is a 400 with the
    apiserver's message (``field label not supported: X``)."""
    out: list[tuple[str, bool, str]] = []
    if not text or not text.strip():
        return out
    for part in _split_top(text):
        m = re.match(r"^([A-Za-z0-9.\[\]_-]+)\s*(==|=|!=)\s*(.*)$", part)
        if not m:
            raise err_bad_request(f"invalid selector: {text!r}; can't understand {part!r}")
        field, op, value = m.groups()
        if field not in known:
            raise err_bad_request(f'"{field}" is not a known field selector: only "{", ".join(sorted(known))}"')
        out.append((field, op != "!=", value))
    return out


def field_value(obj: JSON, path: str) -> str:
    """The string value of a dotted field path (``status.phase``), "" when absent."""
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, dict):
            return ""
        cur = cur.get(part)
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


def match_fields(obj: JSON, reqs: list[tuple[str, bool, str]]) -> bool:
    """Whether ``obj`` satisfies every parsed field requirement."""
    for field, equal, value in reqs:
        if (field_value(obj, field) == value) != equal:
            return False
    return True


# ------------------------------------------------------------------ $(VAR) expansion


def expand(text: str, env: Mapping[str, str]) -> str:
    """Expand ``$(VAR)`` references the way the kubelet expands command, args and
    env values (k8s.io/kubernetes/third_party/forked/golang/expansion.Expand):
    ``$(NAME)`` becomes the value when NAME is defined and stays as written when
    it is not; ``$$`` becomes ``$`` (so ``$$(NAME)`` is the literal ``$(NAME)``);
    any other ``$x`` is kept; an unclosed ``$(`` is kept."""
    out: list[str] = []
    checkpoint = 0
    cursor = 0
    n = len(text)
    while cursor < n:
        if text[cursor] == "$" and cursor + 1 < n:
            out.append(text[checkpoint:cursor])
            rest = text[cursor + 1 :]
            if rest[0] == "$":
                read, is_var, advance = "$", False, 1
            elif rest[0] == "(":
                close = rest.find(")", 1)
                if close == -1:
                    read, is_var, advance = "$(", False, 1
                else:
                    read, is_var, advance = rest[1:close], True, close + 1
            else:
                read, is_var, advance = "$" + rest[0], False, 1
            if is_var:
                out.append(env[read] if read in env else f"$({read})")
            else:
                out.append(read)
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    return "".join(out) + text[checkpoint:]


# ----------------------------------------------------------------------- patches


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (``application/merge-patch+json``); also used,
    as an approximation, for strategic merge patches (lists are replaced whole)."""
    if not isinstance(patch, dict):
        return clone(patch)
    result = clone(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise err_bad_request(f"invalid JSON pointer {path!r} in json patch")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def json_patch(target: Any, ops: list[JSON]) -> Any:
    """RFC 6902 JSON patch (``application/json-patch+json``): add, remove,
    replace, test, copy, move. Raises ApiError 422/400 on a failing op."""
    doc = clone(target)
    for op in ops:
        kind = op.get("op")
        parts = _pointer(str(op.get("path", "")))
        if kind in ("copy", "move"):
            src_parts = _pointer(str(op.get("from", "")))
            value = _get(doc, src_parts)
            if kind == "move":
                doc = _remove(doc, src_parts)
            doc = _add(doc, parts, clone(value))
        elif kind == "add":
            doc = _add(doc, parts, clone(op.get("value")))
        elif kind == "remove":
            doc = _remove(doc, parts)
        elif kind == "replace":
            doc = _remove(doc, parts)
            doc = _add(doc, parts, clone(op.get("value")))
        elif kind == "test":
            if _get(doc, parts) != op.get("value"):
                raise ApiError(status_failure(422, "Invalid", f"json patch test failed at {op.get('path')}"))
        else:
            raise err_bad_request(f"unknown json patch op {kind!r}")
    return doc


def _get(doc: Any, parts: list[str]) -> Any:
    cur = doc
    for p in parts:
        if isinstance(cur, list):
            cur = cur[int(p)]
        elif isinstance(cur, dict) and p in cur:
            cur = cur[p]
        else:
            raise ApiError(status_failure(422, "Invalid", f"json patch: path /{'/'.join(parts)} not found"))
    return cur


def _add(doc: Any, parts: list[str], value: Any) -> Any:
    if not parts:
        return value
    parent = _get(doc, parts[:-1])
    last = parts[-1]
    if isinstance(parent, list):
        if last == "-":
            parent.append(value)
        else:
            parent.insert(int(last), value)
    elif isinstance(parent, dict):
        parent[last] = value
    else:
        raise ApiError(status_failure(422, "Invalid", f"json patch: cannot add at /{'/'.join(parts)}"))
    return doc


def _remove(doc: Any, parts: list[str]) -> Any:
    if not parts:
        return None
    parent = _get(doc, parts[:-1])
    last = parts[-1]
    try:
        if isinstance(parent, list):
            parent.pop(int(last))
        else:
            del parent[last]
    except (KeyError, IndexError, ValueError, TypeError):
        raise ApiError(status_failure(422, "Invalid", f"json patch: path /{'/'.join(parts)} not found")) from None
    return doc
