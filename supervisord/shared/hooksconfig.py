"""The ``hooks:`` config: its model, its validation, and ``submit --on-done``.

Hooks come from the daemon config and the user config only (README.md,
"Hooks"): a project file, a task file or ``--config`` that holds ``hooks``
is refused with an error naming the file (a cloned repository must not add
commands that run on this machine). Each layer's ``hooks`` is a list of::

    - name: notify                  # required; letters, digits, . _ - (1-63); unique
      when: [COMPLETED, ERROR]      # phases; default: the terminal phases
      match:                        # optional; every key given must match
        project: ml                 # a glob (fnmatch) or a list of globs
        name: "train*"
        backend: local
        reason: [OOMKilled, NonZeroExit]
      command: [notify-send, jobsup]   # argv, no shell (use [sh, -c, "..."] for one)
      timeout_s: 30                 # command hooks only (default 30)
      # or
      webhook:
        url: https://chat.example/hooks/abc
        secret_env: JOBSUP_HOOK_SECRET   # the daemon's env variable holding the HMAC key
        timeout_s: 10               # one request (default 10)
        retry_for_s: 3600           # keep retrying for this long (default 3600)
        in_flight: 8                # deliveries under way at once, for different runs (default 8; 1 = one at a time)
      backfill: false               # a new hook starts at the end of the log unless true

``when`` is not ``on``: YAML 1.1 reads a bare ``on`` as true.

Every problem of every layer is reported at once, as
``"<file> (<layer> config): hooks[i].<key>: <reason>"`` lines; a value under a
secret-looking key or a webhook URL (chat webhook URLs are secrets) is never
shown.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any, Final
from urllib.parse import urlsplit

from store.types import PHASES, TERMINAL_PHASES
from supervisord.shared.config.layer import Layer
from supervisord.shared.exceptions import ConfigError, TaskError
from supervisord.shared.retry import RETRYING

__all__ = [
    "DEFAULT_COMMAND_TIMEOUT_S",
    "DEFAULT_IN_FLIGHT",
    "DEFAULT_RETRY_FOR_S",
    "DEFAULT_WEBHOOK_TIMEOUT_S",
    "HOOK_LAYERS",
    "MATCH_KEYS",
    "ON_DONE_HOOK",
    "HookSpec",
    "WebhookTarget",
    "hooks_from_layers",
    "load_hooks",
    "on_done_spec",
    "parse_on_done",
]

#: The config layers that may hold ``hooks``.
HOOK_LAYERS: Final = ("daemon", "user")
#: The name of the hook that runs each run's ``submit --on-done`` command.
ON_DONE_HOOK: Final = "on-done"
#: The run fields ``match`` may test.
MATCH_KEYS: Final = ("project", "name", "backend", "reason")
DEFAULT_COMMAND_TIMEOUT_S: Final = 30
DEFAULT_WEBHOOK_TIMEOUT_S: Final = 10
DEFAULT_RETRY_FOR_S: Final = 3600
#: Webhook deliveries of one hook under way at once (for different runs).
DEFAULT_IN_FLIGHT: Final = 1
MAX_IN_FLIGHT: Final = 64
#: The longest timeout or retry window accepted: a week.
_MAX_S: Final = 7 * 86400

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_HOOK_KEYS: Final = ("name", "when", "match", "command", "timeout_s", "webhook", "backfill")
_WEBHOOK_KEYS: Final = ("url", "secret_env", "timeout_s", "retry_for_s", "in_flight")


@dataclasses.dataclass(frozen=True)
class WebhookTarget:
    """Where a webhook POSTs: ``url`` (http or https; a secret: never logged
    or recorded), ``secret_env`` (the daemon's environment variable holding
    the HMAC key, or None for no signature), ``timeout_s`` (one request,
    seconds), ``retry_for_s`` (how long to keep retrying one event),
    ``in_flight`` (how many deliveries may be under way at once, each for a
    different run; they start in event order: see
    :mod:`supervisord.daemon.hooks.delivery`)."""

    url: str = dataclasses.field(repr=False)  # a secret: kept out of reprs and logs
    secret_env: str | None = None
    timeout_s: float = DEFAULT_WEBHOOK_TIMEOUT_S
    retry_for_s: float = DEFAULT_RETRY_FOR_S
    in_flight: int = DEFAULT_IN_FLIGHT

    def shown_url(self) -> str:
        """The URL without path, query or credentials (``https://host:port``):
        what listings show (a chat webhook's path is its secret)."""
        parts = urlsplit(self.url)
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
        return f"{parts.scheme}://{host}{port}/…"


@dataclasses.dataclass(frozen=True)
class HookSpec:
    """One validated hook.

    ``when``: the phases whose ``PhaseChanged`` events it runs for.
    ``match``: run field -> globs, one of which must match (fnmatch,
    case-sensitive). Exactly one of ``command`` (argv) and ``webhook``.
    ``timeout_s``: a command's time limit (seconds). ``backfill``: a new hook
    starts at the beginning of the log instead of its end. ``source``: where
    it was configured (``"/path/daemon.yaml (daemon config)"``,
    ``"submit --on-done"``).
    """

    name: str
    when: frozenset[str]
    command: tuple[str, ...] | None = None
    webhook: WebhookTarget | None = None
    match: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S
    backfill: bool = False
    source: str = ""

    @property
    def kind(self) -> str:
        """``"command"`` or ``"webhook"``."""
        return "command" if self.command is not None else "webhook"

    @property
    def checkpoint_name(self) -> str:
        """The name of its checkpoint in the store: ``hook:<name>``."""
        return f"hook:{self.name}"

    def describe(self) -> dict[str, Any]:
        """The JSON shape listings show: name, kind, when, match, target
        (argv, or the URL without its path), source. Never a secret."""
        return {
            "name": self.name,
            "kind": self.kind,
            "when": [p for p in (*PHASES, RETRYING) if p in self.when],
            "match": {k: list(v) for k, v in self.match.items()},
            "target": list(self.command)
            if self.command is not None
            else (self.webhook.shown_url() if self.webhook else None),
            "source": self.source,
        }


def _where(layer: Layer) -> str:
    return f"{layer.file} ({layer.name} config)" if layer.file else f"{layer.name} config"


def _seconds(value: Any, what: str, errors: list[str], default: float) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= _MAX_S:
        errors.append(f"{what}: must be a number of seconds in (0, {_MAX_S}], got {_show(value)}")
        return default
    return float(value)


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return f"{value!r} (a string)"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return "null" if value is None else repr(value)


def _globs(value: Any, what: str, errors: list[str]) -> tuple[str, ...]:
    items = value if isinstance(value, list) else [value]
    if not items or not all(isinstance(v, str) and v for v in items):
        errors.append(f"{what}: must be a non-empty string (a glob) or a list of them, got {_show(value)}")
        return ()
    return tuple(items)


def _webhook(raw: Any, at: str, errors: list[str], env: Mapping[str, str]) -> WebhookTarget | None:
    if not isinstance(raw, Mapping):
        errors.append(
            f"{at}.webhook: must be a mapping with url (and secret_env, timeout_s, retry_for_s, in_flight), "
            f"got {_show(raw)}"
        )
        return None
    errors.extend(
        f"{at}.webhook.{key}: unknown key; allowed: {', '.join(_WEBHOOK_KEYS)}"
        for key in raw
        if key not in _WEBHOOK_KEYS
    )
    url = raw.get("url")
    ok = True
    if not isinstance(url, str) or not url:
        errors.append(f"{at}.webhook.url: is required (an http:// or https:// URL)")
        ok = False
    else:
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - raises ValueError for a bad port
        except ValueError:
            parts = None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            errors.append(f"{at}.webhook.url: must be an http:// or https:// URL with a host (value not shown)")
            ok = False
    secret_env = raw.get("secret_env")
    if secret_env is not None:
        if not isinstance(secret_env, str) or not _ENV_NAME.match(secret_env):
            errors.append(f"{at}.webhook.secret_env: must name an environment variable, got {_show(secret_env)}")
            ok = False
        elif not env.get(secret_env):
            errors.append(
                f"{at}.webhook.secret_env: the daemon's environment has no (or an empty) {secret_env}; "
                "set it where the daemon starts (e.g. systemd's Environment=) or remove secret_env"
            )
            ok = False
    timeout_s = _seconds(raw.get("timeout_s"), f"{at}.webhook.timeout_s", errors, DEFAULT_WEBHOOK_TIMEOUT_S)
    retry_for_s = _seconds(raw.get("retry_for_s"), f"{at}.webhook.retry_for_s", errors, DEFAULT_RETRY_FOR_S)
    in_flight = raw.get("in_flight", DEFAULT_IN_FLIGHT)
    if isinstance(in_flight, bool) or not isinstance(in_flight, int) or not 1 <= in_flight <= MAX_IN_FLIGHT:
        errors.append(f"{at}.webhook.in_flight: must be a whole number in 1..{MAX_IN_FLIGHT}, got {_show(in_flight)}")
        ok = False
    if not ok:
        return None
    assert isinstance(url, str)
    return WebhookTarget(url, secret_env, timeout_s, retry_for_s, in_flight)


def _one_hook(raw: Any, at: str, source: str, errors: list[str], env: Mapping[str, str]) -> HookSpec | None:
    before = len(errors)
    if not isinstance(raw, Mapping):
        errors.append(f"{at}: must be a mapping (name, when, match, command or webhook), got {_show(raw)}")
        return None
    for key in raw:
        if key not in _HOOK_KEYS:
            hint = " (`on` is read by YAML as true: use `when:`)" if key in ("on", "True") else ""
            errors.append(f"{at}.{key}: unknown key{hint}; allowed: {', '.join(_HOOK_KEYS)}")
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        errors.append(f"{at}.name: is required: 1-63 letters, digits, '.', '_' or '-', got {_show(name)}")
    elif name == ON_DONE_HOOK:
        errors.append(f"{at}.name: {ON_DONE_HOOK!r} is reserved for `submit --on-done`")
    when_raw = raw.get("when")
    when: frozenset[str] = TERMINAL_PHASES
    if when_raw is not None:
        items = when_raw if isinstance(when_raw, list) else [when_raw]
        bad = [v for v in items if not isinstance(v, str) or (v.upper() not in PHASES and v.upper() != "RETRYING")]
        if not items or bad:
            got = ", ".join(_show(v) for v in bad) if bad else "an empty list"
            errors.append(
                f"{at}.when: must be a list of phases ({', '.join(PHASES)}), got {got}"
                " (or Retrying: a retried run's failed attempt)"
            )
        else:
            when = frozenset(RETRYING if str(v).upper() == "RETRYING" else str(v).upper() for v in items)
    match: dict[str, tuple[str, ...]] = {}
    match_raw = raw.get("match")
    if match_raw is not None:
        if not isinstance(match_raw, Mapping):
            errors.append(f"{at}.match: must be a mapping of {', '.join(MATCH_KEYS)}, got {_show(match_raw)}")
        else:
            for key, value in match_raw.items():
                if key not in MATCH_KEYS:
                    errors.append(f"{at}.match.{key}: unknown key; allowed: {', '.join(MATCH_KEYS)}")
                else:
                    match[key] = _globs(value, f"{at}.match.{key}", errors)
    command_raw, webhook_raw = raw.get("command"), raw.get("webhook")
    command: tuple[str, ...] | None = None
    webhook: WebhookTarget | None = None
    if (command_raw is None) == (webhook_raw is None):
        errors.append(f"{at}: give exactly one of command (an argv list) and webhook (a mapping with url)")
    elif command_raw is not None:
        if isinstance(command_raw, str):
            errors.append(
                f"{at}.command: must be a list of argv words, not a string (no shell is used); "
                f"write e.g. {[*shlex.split(command_raw)] if _splits(command_raw) else ['sh', '-c', '...']} "
                "or [sh, -c, '...'] for shell syntax"
            )
        elif not isinstance(command_raw, list) or not command_raw:
            errors.append(f"{at}.command: must be a non-empty list of argv words, got {_show(command_raw)}")
        else:
            bad_words = [
                f"{at}.command[{i}]: must be a non-empty string without NUL, got {_show(w)}"
                + (" (YAML reads yes/no/on/off/true/false as booleans: quote it)" if isinstance(w, bool) else "")
                for i, w in enumerate(command_raw)
                if not isinstance(w, str) or not w or "\0" in w
            ]
            errors.extend(bad_words)
            if not bad_words:
                command = tuple(command_raw)
    else:
        webhook = _webhook(webhook_raw, at, errors, env)
    if raw.get("timeout_s") is not None and webhook_raw is not None and command_raw is None:
        errors.append(f"{at}.timeout_s: is for command hooks; a webhook's is webhook.timeout_s")
    timeout_s = _seconds(raw.get("timeout_s"), f"{at}.timeout_s", errors, DEFAULT_COMMAND_TIMEOUT_S)
    backfill = raw.get("backfill", False)
    if not isinstance(backfill, bool):
        errors.append(f"{at}.backfill: must be true or false, got {_show(backfill)}")
    if len(errors) > before:
        return None
    assert isinstance(name, str)
    return HookSpec(
        name=name, when=when, command=command, webhook=webhook, match=match,
        timeout_s=timeout_s, backfill=bool(backfill), source=source,
    )  # fmt: skip


def _splits(text: str) -> bool:
    try:
        return bool(shlex.split(text))
    except ValueError:
        return False


def hooks_from_layers(layers: Sequence[Layer], env: Mapping[str, str] = os.environ) -> tuple[list[HookSpec], list[str]]:
    """The hooks of the daemon and user layers among ``layers`` (any other
    layer is skipped: ``hooks`` there is refused by the config's own layer
    validation, naming the file) with every error found: ``(hooks, errors)``. ``env`` is the daemon's environment, where
    ``webhook.secret_env`` must be set. Names must be unique across layers."""
    hooks: list[HookSpec] = []
    errors: list[str] = []
    seen: dict[str, str] = {}
    for layer in layers:
        if layer.name not in HOOK_LAYERS:
            continue
        raw = layer.data.get("hooks")
        if raw is None:
            continue
        where = _where(layer)
        if not isinstance(raw, list):
            errors.append(f"{where}: hooks: must be a list of hooks, got {_show(raw)}")
            continue
        for i, item in enumerate(raw):
            at = f"{where}: hooks[{i}]"
            spec = _one_hook(item, at, where, errors, env)
            name = item.get("name") if isinstance(item, Mapping) else None
            if isinstance(name, str):
                if name in seen:
                    errors.append(f"{at}.name: {name!r} is already the name of a hook in {seen[name]}")
                    continue
                seen[name] = where
            if spec is not None:
                problems = _schema_problems(item, at)
                errors.extend(problems)
                if not problems:
                    hooks.append(spec)
    return hooks, errors


def _schema_problems(raw: Mapping[str, Any], at: str) -> list[str]:
    """What the config schema (:data:`supervisord.shared.config.schema.HOOK_SCHEMA`,
    which ``jobsup schema config`` shows) refuses in a hook the checks above
    took: the schema is the contract; the checks above give each problem
    its own words, and a test keeps them in step (tests/supervisord/hooks/
    test_hooks_schema.py). Values are not shown (a webhook URL is a secret)."""
    from supervisord.shared.config.schema import schema_violations

    document = {"hooks": [{k: v for k, v in raw.items() if v is not None}]}
    return [
        f"{at}{''.join(f'[{p}]' if isinstance(p, int) else f'.{p}' for p in path[2:])}: "
        f"does not match the config schema (`{keyword}`; see `jobsup schema config`)"
        for path, keyword in schema_violations(document)
    ]


def load_hooks(layers: Sequence[Layer], env: Mapping[str, str] = os.environ) -> list[HookSpec]:
    """:func:`hooks_from_layers`, raising ConfigError with every error."""
    hooks, errors = hooks_from_layers(layers, env)
    if errors:
        raise ConfigError.of(errors, "hook config errors")
    return hooks


def parse_on_done(text: str) -> list[str]:
    """The argv of ``submit --on-done CMD``: ``CMD`` split as a POSIX shell
    would split words (shlex), with no shell run. Raises TaskError naming
    the flag for an empty or unbalanced command."""
    try:
        argv = shlex.split(text)
    except ValueError as exc:
        raise TaskError(f"--on-done: cannot split the command into words: {exc}") from None
    if not argv:
        raise TaskError("--on-done: the command is empty")
    if any("\0" in w for w in argv):
        raise TaskError("--on-done: the command must not contain NUL characters")
    return argv


def on_done_spec(argv: Sequence[str]) -> HookSpec:
    """The hook that runs one run's recorded ``on_done`` argv when it reaches
    a terminal phase (default command timeout)."""
    return HookSpec(name=ON_DONE_HOOK, when=TERMINAL_PHASES, command=tuple(argv), source="submit --on-done")
