"""The submitting shell's environment (README, "Where your run runs").

A local run gets the environment of the shell that ran ``jobsup submit``
(``local.env_from: submitter``, the default), as pueue and task-spooler do:
the client captures it (:func:`capture`) and sends it with the submit; the
daemon checks it (:func:`check_shell_env`) and records names and keyed
digests only (``Submitted.shell_env``), never a value. ``JOBSUP_*``
variables are never taken: they are jobsup's own (the client's state dir
and socket, or the variables of a run that submits another run).

Pure: no anyio, no store (the CLI imports it).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Final

from supervisord.shared.envcheck import MAX_ARG_STRLEN
from supervisord.shared.exceptions import TaskError
from supervisord.shared.secret import digest

__all__ = ["DEFAULT_ENV_FROM", "ENV_FROM", "capture", "check_shell_env", "shell_env_digest", "without_jobsup"]

#: The values of ``local.env_from``.
ENV_FROM: Final = ("submitter", "daemon")
#: Its default.
DEFAULT_ENV_FROM: Final = "submitter"
_PREFIX: Final = "JOBSUP_"


def without_jobsup(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without its ``JOBSUP_*`` variables."""
    return {k: v for k, v in env.items() if not k.startswith(_PREFIX)}


def capture(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a submit sends: ``env`` (default this process's,
    ``os.environ``) without ``JOBSUP_*``."""
    return without_jobsup(os.environ if env is None else env)


def check_shell_env(env: object) -> dict[str, str]:
    """The shell environment of a submit request, checked: a mapping of
    text names to text values that execve(2) can pass one by one (the
    total is :func:`supervisord.shared.envcheck.check_env`'s). Names are those a
    process environment can hold (not empty, no ``=`` or NUL): a shell
    exports more than identifiers (``BASH_FUNC_module%%``). ``JOBSUP_*`` are
    dropped.

    Raises TaskError naming the variable (never its value)."""
    if not isinstance(env, Mapping):
        raise TaskError("submit: `shell_env` must map names to values")
    out: dict[str, str] = {}
    for name, value in env.items():
        if not isinstance(name, str) or not name or "=" in name or "\0" in name:
            raise TaskError(f"shell environment: {str(name)[:64]!r} is not a name a process environment can hold")
        if not isinstance(value, str):
            raise TaskError(f"shell environment: {name}: the value must be text")
        if "\0" in value:
            raise TaskError(f"shell environment: {name}: the value holds a NUL byte, which no process can be given")
        # Bytes that are not UTF-8 arrive as lone surrogates (os.environ's
        # surrogateescape) and go back to the same bytes (the runner's os.fsencode).
        size = len(os.fsencode(name)) + 1 + len(os.fsencode(value)) + 1
        if size > MAX_ARG_STRLEN:
            raise TaskError(
                f"shell environment: {name}: NAME=VALUE is {size} bytes; the kernel passes at most "
                f"{MAX_ARG_STRLEN} bytes per variable (MAX_ARG_STRLEN): unset it or put the value in a file"
            )
        if not name.startswith(_PREFIX):
            out[name] = value
    return out


def shell_env_digest(env: Mapping[str, str], key: bytes) -> dict[str, str]:
    """NAME -> keyed digest (:func:`supervisord.shared.secret.digest`) of each value,
    names sorted: what ``Submitted.shell_env`` records. A value holding bytes
    that are not UTF-8 is digested as its bytes with those escaped."""
    return {k: digest(_text(v), key) for k, v in sorted(env.items())}


def _text(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return os.fsencode(value).decode("utf-8", "backslashreplace")
    return value
