"""``jobsup mcp``: jobsup's tools for agents, as a Model Context Protocol
server on stdio (the official ``mcp`` SDK's low-level :class:`mcp.server.Server`).

It is a client like the CLI: every tool talks to the daemon through
:class:`supervisord.client.api.Client` (started in the background when none
answers, unless ``JOBSUP_NO_AUTOSTART=1``), and returns the same JSON objects
as ``-o json``. Each tool declares a JSON Schema (draft 2020-12) for its
input and for its structured output, built from :mod:`supervisord.shared.schemas`.

Errors come back as tool errors (``isError: true``) whose text is jobsup's
one-line message, prefixed by the argument at fault (``run: no run matches
'zzzz'``, ``timeout_s: -1 is less than the minimum of 0``). Bad input is
refused before anything is sent to the daemon, so nothing is recorded.

Blocking client calls run in worker threads with their own limiter. ``wait``
asks the daemon in slices of at most :data:`WAIT_SLICE_S` seconds, each in a
thread the handler abandons when the MCP client cancels the call, so a
cancelled wait returns at once and its thread ends within one slice.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from collections.abc import Callable, Generator, Mapping
from pathlib import Path
from typing import Any

import anyio
import jsonschema
import mcp_types as types
import structlog
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server

from store.types import PHASES
from supervisord.client.api import Client
from supervisord.client.cli.triage_hints import deadline_hint, oom_hint, reservation_hint
from supervisord.shared import schemas
from supervisord.shared.exceptions import (
    AmbiguousRunError,
    DaemonUnreachableError,
    JobsupError,
    RunNotFoundError,
    TaskError,
    UsageError,
)
from supervisord.shared.lifecycle import ACTIVE_PHASES
from supervisord.shared.runref import RUN_ID_PATTERN, RUN_REF_PATTERN, run_id_schema, run_ref_schema
from supervisord.shared.task import BACKENDS
from supervisord.shared.wire import EXIT_WAIT_TIMEOUT, exit_code_for_phase

__all__ = ["TOOLS", "Handlers", "JobsupTools", "Tool", "ToolError", "build_server", "serve", "triage_suggestion"]

log = structlog.get_logger("jobsup.mcp")

#: Longest single ``GET /wait`` the ``wait`` tool makes (seconds).
WAIT_SLICE_S = 1.0
#: Longest ``timeout_s`` a ``wait`` call accepts (seconds).
MAX_WAIT_S = 3600
#: ``logs``: default and largest byte cap of the returned text.
LOGS_DEFAULT_BYTES = 16 * 1024
LOGS_MAX_BYTES = 1024 * 1024
#: ``triage``: how many of the newest log lines are searched for errors, and
#: how many error-looking lines are returned.
TRIAGE_SCAN_LINES = 2000
TRIAGE_ERROR_LINES = 20

_SCHEDULING_FIELDS = (
    "queue",
    "priority",
    "gpus",
    "after",
    "after_any",
    "after_failed",
    "hold",
    "memory",
    "cpus",
    "retry",
)


class ToolError(Exception):
    """A tool call failed: ``str(err)`` is the one line the agent sees."""


# -- schemas -------------------------------------------------------------------

_STR = {"type": "string", "minLength": 1}
#: A run id or a unique prefix: :mod:`supervisord.shared.runref`'s rule, as JSON Schema.
_RUN_REF = run_ref_schema()
#: A sweep id or a unique prefix of one (supervisord.shared.sweep).
_SWEEP_REF = {
    "type": "string",
    "pattern": "^s[0-9a-f]{4,11}$",
    "description": "a sweep id (s and 11 lowercase hex characters) or a unique prefix of 5+ characters",
}
#: Where a tool acts on several runs: a run, or a sweep (all of its runs).
_RUN_OR_SWEEP = {"anyOf": [_RUN_REF, _SWEEP_REF]}
_TASK_PROPS: dict[str, Any] = {
    "task_file": {"type": "string", "description": "path of a task YAML file (relative to cwd)"},
    "command": {
        "anyOf": [{"type": "string", "minLength": 1}, {"type": "array", "items": {"type": "string"}, "minItems": 1}],
        "description": "the command: a shell string, or argv words (joined as `jobsup submit -- CMD...` joins them); "
        "overrides the task file's `run:`",
    },
    "name": {**_STR, "description": "the run's name (default: first word of the command)"},
    "timeout": {"type": "string", "description": "wall-clock limit: 90s, 30m, 4h or 1d (default 4h)"},
    "manifest": {**_STR, "description": "Kubernetes manifest path in the repository (default .jobsup/k8s.yaml)"},
    "rev": {**_STR, "description": "the commit to snapshot and run (default HEAD)"},
    "config": {
        "type": "array",
        "items": {"type": "string"},
        "description": "KEY.PATH=VALUE overrides, or one config file",
    },
    "cwd": {
        "type": "string",
        "description": "the folder to submit from (its git repository is snapshotted); default: the server's",
    },
}
_SUBMIT_PROPS: dict[str, Any] = {
    **_TASK_PROPS,
    "backend": {"enum": list(BACKENDS)},
    "env": {
        "type": "object",
        "additionalProperties": {"type": "string"},
        "description": "environment for the run (values are never recorded)",
    },
    "force": {"type": "boolean", "description": "submit even if the same project+name has a run in flight"},
    "queue": {**_STR, "description": "the queue (default `default`)"},
    "priority": {
        "type": "integer",
        "minimum": -1000,
        "maximum": 1000,
        "description": "higher starts first, then oldest",
    },
    "gpus": {
        "type": "integer",
        "minimum": 0,
        "description": "local runs: GPUs of this machine; Slurm runs: sbatch --gpus",
    },
    "after": {"type": "array", "items": _RUN_REF, "description": "start after these runs COMPLETED"},
    "after_any": {
        "type": "array",
        "items": _RUN_REF,
        "description": "start after these runs end, whatever the outcome",
    },
    "after_failed": {
        "type": "array",
        "items": _RUN_REF,
        "description": "start only if these runs ended ERROR (else it ends CANCELED DependencyFailed)",
    },
    "hold": {"type": "boolean", "description": "queue it held (released with `jobsup release`)"},
    "retry": {
        "anyOf": [
            {"type": "integer", "minimum": 1, "maximum": 100},
            {
                "type": "object",
                "required": ["attempts"],
                "additionalProperties": False,
                "properties": {
                    "attempts": {"type": "integer", "minimum": 1, "maximum": 100},
                    "on": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                    "backoff": {"type": "string"},
                },
            },
        ],
        "description": "retry up to N times on Lost, Evicted, Preempted, NodeFailure, OOMKilled (as `submit --retry N`), "
        "or {attempts, on: [REASON | exit:CODE], backoff: '30s'} (as a task's `retry:`)",
    },
    "on_done": {
        "type": "array",
        "items": {"type": "string", "minLength": 1},
        "minItems": 1,
        "description": "argv run when the run ends (as `submit --on-done`), from cwd, with the run's last lines on stdin",
    },
    "sweep": {
        "type": "object",
        "minProperties": 1,
        "additionalProperties": {
            "oneOf": [
                {"type": "array", "minItems": 1, "items": {"type": ["string", "number", "boolean"]}},
                {"type": "string", "description": "an inclusive integer range A..B"},
            ]
        },
        "description": "a sweep: KEY -> values (or 'A..B'), one run per combination; {KEY} in the command and "
        "name is replaced (as `submit --sweep`); returns the sweep instead of a run",
    },
    "max_parallel": {"type": "integer", "minimum": 1, "description": "a sweep: at most N of its runs at once"},
    "labels": {
        "type": "object",
        "additionalProperties": {"type": "string"},
        "description": "labels of the run (as `submit --label K=V`)",
    },
    "memory": {
        "type": "string",
        "minLength": 1,
        "description": "local runs: memory limit of the whole process tree, e.g. 16G or 512M (ends it OOMKilled past "
        "it); Slurm runs: sbatch --mem",
    },
    "cpus": {
        "type": "number",
        "exclusiveMinimum": 0,
        "description": "local runs: CPUs it needs, e.g. 2 or 0.5; Slurm runs: sbatch --cpus-per-task (rounded up)",
    },
}
_RUNS_ARG = {"type": "array", "items": _RUN_REF, "minItems": 1}


def _obj(props: dict[str, Any], required: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(required), "additionalProperties": False}


def _bundle_into(defs: dict[str, Any], name: str) -> dict[str, Any]:
    """Put schema ``name`` under ``defs[name]`` (its own ``$defs`` re-homed
    there) and return a reference to it."""
    if name not in defs:
        doc = schemas.load(name)
        doc.pop("$schema", None)
        # The bundle's references are document-absolute: re-home them.
        defs[name] = json.loads(json.dumps(doc).replace('"#/$defs/', f'"#/$defs/{name}/$defs/'))
    return {"$ref": f"#/$defs/{name}"}


def _wrap(props: dict[str, str | dict[str, Any]], required: list[str], *, defs: tuple[str, ...] = ()) -> dict[str, Any]:
    """A self-contained object schema whose properties are schema names
    (bundled into ``$defs``) or inline schemas; ``defs`` names more schemas
    to bundle for inline ``{"$ref": "#/$defs/NAME"}`` references."""
    bundled: dict[str, Any] = {}
    out = {key: _bundle_into(bundled, spec) if isinstance(spec, str) else spec for key, spec in props.items()}
    for name in defs:
        _bundle_into(bundled, name)
    schema: dict[str, Any] = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": out,
        "required": required,
        "additionalProperties": False,
    }
    if bundled:
        schema["$defs"] = bundled
    return schema


def _top(name: str) -> dict[str, Any]:
    """Schema ``name`` as a tool output schema (an object at the root)."""
    doc = schemas.load(name)
    doc.setdefault("type", "object")
    return doc


_LINES = {"type": "array", "items": {"$ref": "#/$defs/log-line"}}


@dataclasses.dataclass(frozen=True)
class Tool:
    """One MCP tool: its name, description, input and output schemas, and
    the :class:`JobsupTools` method that runs it."""

    name: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]

    def to_mcp(self) -> types.Tool:
        """The ``tools/list`` entry."""
        return types.Tool(
            name=self.name,
            description=self.description,
            input_schema=self.input_schema,
            output_schema=self.output_schema,
        )


def _tools() -> list[Tool]:
    nint = {"type": ["integer", "null"]}
    return [
        Tool(
            "submit",
            "Submit a run of a task (a task file and/or a command, from a git repository) and return the run. "
            "Scheduling options: queue, priority, gpus, after, after_any, after_failed, hold; limits: memory, "
            "cpus; retry (a policy for failed attempts); on_done: a command run when it ends; labels. With `sweep` (and `max_parallel`): one run per "
            "combination, and the sweep (its id, grid, count) and its run ids are returned instead of a run.",
            _obj(_SUBMIT_PROPS),
            _wrap(
                {
                    "run": "run",
                    "sweep": {"type": "object", "required": ["id"], "properties": {"id": {"type": "string"}}},
                    "run_ids": {"type": "array", "items": {"type": "string"}},
                    "warnings": {"type": "array", "items": {"type": "string"}},
                },
                ["warnings"],
            ),
        ),
        Tool(
            "render",
            "The Kubernetes objects a submit with --backend kubernetes would create, or (backend: slurm) the exact "
            "sbatch command and wrapper script of --backend slurm (a preview: nothing is created).",
            _obj(
                dict(_TASK_PROPS.items())
                | {
                    "backend": {"enum": ["kubernetes", "slurm"], "description": "what to render (default kubernetes)"},
                    "gpus": {"type": "integer", "minimum": 0, "description": "slurm: --gpus"},
                    "memory": {"type": "string", "minLength": 1, "description": "slurm: --mem, e.g. 16G or 512M"},
                    "cpus": {"type": "number", "exclusiveMinimum": 0, "description": "slurm: --cpus-per-task"},
                    "run_id": {
                        **run_id_schema(),
                        "description": "the run id to render with: "
                        + run_id_schema()["description"]
                        + "; default: a random one",
                    },
                }
            ),
            _wrap(
                {
                    "objects": {"type": "array", "items": {"type": "object"}},
                    "notes": {"type": "array", "items": {"type": "string"}},
                    "warnings": {"type": "array", "items": {"type": "string"}},
                    "slurm": {
                        "type": "object",
                        "description": "backend slurm: as `jobsup render --backend slurm -o json` (objects is empty)",
                        "required": ["where", "run_dir", "sbatch", "command", "wrapper"],
                        "properties": {
                            "where": {"type": "string"},
                            "run_dir": {"type": "string"},
                            "sbatch": {"type": "array", "items": {"type": "string"}},
                            "command": {"type": "string"},
                            "wrapper": {"type": "string"},
                        },
                    },
                },
                ["objects", "notes", "warnings"],
            ),
        ),
        Tool(
            "runs",
            "List runs, newest first: in flight and the 20 newest (all=true: every run); filter by labels "
            "(each must match), a name glob, a sweep.",
            _obj(
                {
                    "all": {"type": "boolean"},
                    "project": _STR,
                    "phase": {"enum": list(PHASES)},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                    "name": {**_STR, "description": "a glob: train*, *[lr=1e-4*"},
                    "sweep": _SWEEP_REF,
                }
            ),
            _wrap({"runs": "runs"}, ["runs"]),
        ),
        Tool(
            "show",
            "One run: phase, reason, times, handle, command, source, effective config.",
            _obj({"run": _RUN_REF}, ["run"]),
            _top("run-detail"),
        ),
        Tool(
            "logs",
            "A run's stored log lines: the last `tail` lines, or lines from_line..to_line; at most max_bytes of text, "
            "counting a newline per line (`truncated` says when the cap cut the answer; continue with "
            "from_line=next_line, and from_byte=next_byte when next_byte is not null: a line longer than the cap "
            "comes back in pieces, each starting at that UTF-8 byte offset of the line, so following the cursor "
            "gives every byte).",
            _obj(
                {
                    "run": _RUN_REF,
                    "tail": {"type": "integer", "minimum": 1, "maximum": 100000},
                    "attempt": {
                        "type": "integer",
                        "minimum": 1,
                        "description": "a retried run: only this attempt's lines",
                    },
                    "from_line": {"type": "integer", "minimum": 1},
                    "from_byte": {"type": "integer", "minimum": 0, "default": 0},
                    "to_line": {"type": "integer", "minimum": 1},
                    "max_bytes": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": LOGS_MAX_BYTES,
                        "default": LOGS_DEFAULT_BYTES,
                    },
                },
                ["run"],
            ),
            _wrap(
                {
                    "run_id": {"type": "string"},
                    "lines": _LINES,
                    "total_lines": {"type": "integer", "minimum": 0},
                    "truncated": {"type": "boolean"},
                    "next_line": nint,
                    "next_byte": nint,
                },
                ["run_id", "lines", "total_lines", "truncated", "next_line", "next_byte"],
                defs=("log-line",),
            ),
        ),
        Tool(
            "wait",
            "Wait until the runs reach a condition (terminal, change, or a phase), at most timeout_s seconds. "
            "Pass after_seq (the cursor a previous wait or a run's last_seq gave) so no change is missed; "
            "returns the outcome, the runs and the new cursor.",
            _obj(
                {
                    "runs": {"type": "array", "items": _RUN_OR_SWEEP, "minItems": 1},
                    "for": {
                        "enum": ["terminal", "change", *PHASES, *(p.lower() for p in PHASES)],
                        "default": "terminal",
                    },
                    "timeout_s": {"type": "number", "minimum": 0, "maximum": MAX_WAIT_S, "default": 60},
                    "after_seq": {"type": "integer", "minimum": 0},
                },
                ["runs"],
            ),
            _top("wait"),
        ),
        Tool(
            "cancel",
            "Cancel runs (a sweep id: all of its runs); returns each run once it is stopped.",
            _obj({"runs": {"type": "array", "items": _RUN_OR_SWEEP, "minItems": 1}}, ["runs"]),
            _wrap({"runs": "runs"}, ["runs"]),
        ),
        Tool(
            "sweep",
            "A sweep's results table: one row per run with its params, phase, elapsed time, last progress and "
            "metrics (sort by a metric or param; a leading '-' sorts descending).",
            _obj({"sweep": _SWEEP_REF, "sort": {**_STR, "description": "a metric or param, e.g. -acc"}}, ["sweep"]),
            _top("sweep"),
        ),
        Tool(
            "hold",
            "Keep queued runs from starting (all or nothing); returns each run after the change.",
            _obj({"runs": _RUNS_ARG}, ["runs"]),
            _wrap({"runs": "runs"}, ["runs"]),
        ),
        Tool(
            "release",
            "Let held runs start (all or nothing); returns each run after the change.",
            _obj({"runs": _RUNS_ARG}, ["runs"]),
            _wrap({"runs": "runs"}, ["runs"]),
        ),
        Tool(
            "pause",
            "Stop running local runs' processes (SIGSTOP) until `resume`; they keep their GPUs, and paused time "
            "does not count toward the timeout.",
            _obj({"runs": _RUNS_ARG}, ["runs"]),
            _wrap({"runs": "runs"}, ["runs"]),
        ),
        Tool(
            "resume",
            "Let paused runs go on (SIGCONT).",
            _obj({"runs": _RUNS_ARG}, ["runs"]),
            _wrap({"runs": "runs"}, ["runs"]),
        ),
        Tool(
            "update",
            "Change queued runs' priority, GPUs, queue, timeout, memory or CPUs (all or nothing; refused for a run past QUEUED). "
            "Returns each run and the old and new values of what changed.",
            _obj(
                {
                    "runs": _RUNS_ARG,
                    "priority": _SUBMIT_PROPS["priority"],
                    "gpus": _SUBMIT_PROPS["gpus"],
                    "queue": _SUBMIT_PROPS["queue"],
                    "timeout": _TASK_PROPS["timeout"],
                    "memory": _SUBMIT_PROPS["memory"],
                    "cpus": _SUBMIT_PROPS["cpus"],
                },
                ["runs"],
            ),
            _top("update"),
        ),
        Tool(
            "rerun",
            "Submit a recorded run's task again as a new run: optionally another commit (rev), another command, "
            "and with_dependents the runs its failure canceled. Env values are not stored: give them in env.",
            _obj(
                {
                    "run": _RUN_REF,
                    "rev": _TASK_PROPS["rev"],
                    "command": {**_STR, "description": "a shell command line to run instead"},
                    "with_dependents": {"type": "boolean"},
                    "env": _SUBMIT_PROPS["env"],
                    "hold": {"type": "boolean"},
                    "force": {"type": "boolean"},
                },
                ["run"],
            ),
            _wrap(
                {
                    "run": "run",
                    "rerun_of": {"type": "string"},
                    "missing_env": {"type": "array", "items": {"type": "string"}},
                    "dependents": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {"run": {"$ref": "#/$defs/run"}, "rerun_of": {"type": "string"}},
                        },
                    },
                    "warnings": {"type": "array", "items": {"type": "string"}},
                },
                ["run", "rerun_of", "missing_env"],
            ),
        ),
        Tool(
            "events",
            "The audit trail, oldest first: events with seq > after_seq (of one run, or all), at most `limit`; "
            "`last_seq` is the cursor for the next page.",
            _obj(
                {
                    "run": _RUN_REF,
                    "after_seq": {"type": "integer", "minimum": 0},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100},
                }
            ),
            _wrap(
                {
                    "events": {"type": "array", "items": {"$ref": "#/$defs/event"}},
                    "last_seq": {"type": "integer"},
                    "more": {"type": "boolean"},
                },
                ["events", "last_seq", "more"],
                defs=("event",),
            ),
        ),
        Tool(
            "queue",
            "The waiting runs in start order with the reason each waits, and the GPUs with who holds them.",
            _obj({}),
            _top("queue"),
        ),
        Tool(
            "outputs",
            "A local run's outputs folder (JOBSUP_OUTPUT_DIR) and, once it has ended, every file it left there "
            "with bytes, sha256 and mtime (symlinks and special files are listed as skipped).",
            _obj({"run": _RUN_REF}, ["run"]),
            _top("outputs"),
        ),
        Tool(
            "which",
            "Which run produced a file: give the file's sha256 (64 hex) or a path on this machine; returns every "
            "recorded run output with that content (run id, name, commit, config digest, when).",
            _obj(
                {
                    "files": {
                        "type": "array",
                        "items": {"type": "string", "minLength": 1},
                        "minItems": 1,
                        "maxItems": 1000,
                        "description": "paths of files, or sha256 digests (64 hex characters)",
                    }
                },
                ["files"],
            ),
            _top("which"),
        ),
        Tool(
            "top",
            "The running local runs' usage now: CPU %, memory (peak, limit), GPU memory and utilisation, elapsed.",
            _obj({}),
            _top("top"),
        ),
        Tool(
            "doctor",
            "Check the daemon, the store and (when configured) Kubernetes access.",
            _obj({}),
            _wrap({"checks": "doctor", "ok": {"type": "boolean"}}, ["checks", "ok"]),
        ),
        Tool(
            "triage",
            "Why a run is where it is: phase, reason, message, exit code, the last error-looking log lines, the pending "
            "reason when queued, and a one-line suggested next step.",
            _obj({"run": _RUN_REF}, ["run"]),
            _wrap(
                {
                    "run": "run",
                    "phase": {"enum": list(PHASES)},
                    "reason": {"type": ["string", "null"]},
                    "message": {"type": ["string", "null"]},
                    "exit_code": nint,
                    "error_lines": _LINES,
                    "last_lines": _LINES,
                    "pending_reason": {"type": ["string", "null"]},
                    "suggestion": {"type": "string"},
                },
                [
                    "run",
                    "phase",
                    "reason",
                    "message",
                    "exit_code",
                    "error_lines",
                    "last_lines",
                    "pending_reason",
                    "suggestion",
                ],
                defs=("log-line",),
            ),
        ),
    ]


TOOLS: list[Tool] = _tools()
_BY_NAME = {t.name: t for t in TOOLS}
_INPUT_VALIDATORS = {t.name: jsonschema.Draft202012Validator(t.input_schema) for t in TOOLS}


def _input_problem(tool: str, args: dict[str, Any]) -> str | None:
    """The first way ``args`` breaks the tool's input schema, as
    ``<argument>: <message>``; None when they conform."""
    errors = sorted(_INPUT_VALIDATORS[tool].iter_errors(args), key=lambda e: list(map(str, e.path)))
    if not errors:
        return None
    err = errors[0]
    if err.validator == "additionalProperties":
        extra = sorted(set(args) - set(_BY_NAME[tool].input_schema["properties"]))
        return f"{', '.join(extra)}: no such argument of {tool} (use {', '.join(_BY_NAME[tool].input_schema['properties'])})"
    if err.validator == "required":
        missing = str(err.message).split("'")[1] if "'" in err.message else "arguments"
        return f"{missing}: required"
    where = ".".join(str(p) for p in err.path) or "arguments"
    if isinstance(err.schema, dict) and err.schema.get("pattern") in (RUN_REF_PATTERN, RUN_ID_PATTERN):
        return f"{where}: {err.instance!r} is not a run id: {err.schema['description']}"
    if err.path and err.path[0] == "env":
        # Never echo an env value: it may be a secret.
        return f"{where}: env must map names to string values (the value is not shown)"
    return f"{where}: {err.message}"


# -- triage --------------------------------------------------------------------

_SUGGESTIONS: dict[str, str] = {
    "NonZeroExit": "the command exited non-zero: read error_lines (or `logs`) for its error and fix the code or its inputs",
    "OOMKilled": "the container ran out of memory: raise resources.limits.memory in .jobsup/k8s.yaml or use less memory",
    "ImagePullBackOff": "the image could not be pulled: check the image name and registry access in .jobsup/k8s.yaml",
    "ErrImagePull": "the image could not be pulled: check the image name and registry access in .jobsup/k8s.yaml",
    "InvalidImageName": "the image name is invalid: fix it in .jobsup/k8s.yaml",
    "DeadlineExceeded": "the run hit its timeout: submit again with a longer timeout (--timeout) or make it faster",
    "Evicted": "the pod was evicted (node pressure): submit again, or ask for less ephemeral storage/memory",
    "StartFailed": "the container could not start: check the command and image entrypoint in .jobsup/k8s.yaml",
    "CreateContainerConfigError": "the container config is invalid (a missing Secret or ConfigMap?): check .jobsup/k8s.yaml",
    "Unschedulable": "no node can take the pod: check resource requests, node selectors and tolerations",
    "BackoffLimitExceeded": "the Job failed: read message and error_lines for the cause",
    "StagingFailed": "copying the source into the pod failed: check the pod can start and the daemon log",
    "Canceled": "the run was canceled on request; submit again if it should run",
    "CancelFailed": "stopping the run failed: check `jobsup doctor` and the daemon log, then cancel again",
    "Lost": "the run's process vanished (machine reboot or killed runner): submit it again",
    "JobDeleted": "the Kubernetes Job was deleted outside jobsup: submit again",
    "InternalError": "jobsup itself failed supervising this run: see the daemon log and report it",
    "BackendError": "the backend failed: run `doctor` for the cause",
    "BackendUnavailable": "the backend is unavailable: run `doctor` (kubeconfig, API reach, RBAC)",
    "KubeconfigError": "the kubeconfig is missing or broken: run `doctor` and fix KUBECONFIG or ~/.kube/config",
    "SubmitInterrupted": "the daemon stopped while submitting: submit again",
    "RunnerFailed": "the local runner failed to start the command: check the command and the run dir",
    "DependencyFailed": "a run this one waited for did not complete: fix that run, then resubmit this one",
    "Held": "the run is held: `jobsup release RUN` lets it start",
    "Paused": "the run is paused (its processes are stopped, it keeps its GPUs): `resume` lets it go on",
    "WaitingForDependency": "the run waits for the runs in `after`/`after_any`: wait for them",
    "WaitingForSlot": "the queue is at its max_parallel: it starts when a run of the queue ends",
    "WaitingForGPUs": "not enough free GPUs: it starts when a GPU holder ends (see `queue`)",
    "WaitingForMemory": "admitted runs claim the memory it asks for (--memory): it starts when one ends (see `queue`)",
    "WaitingForCPUs": "admitted runs claim the CPUs it asks for (--cpus): it starts when one ends (see `queue`)",
}
_LOCAL_OOM = (
    "the run's processes passed its --memory limit and jobsup stopped it: submit again with a larger --memory "
    "(show's usage.max_rss_bytes has the peak) or use less memory"
)
_PENDING_REASONS = frozenset(
    {"Held", "WaitingForDependency", "WaitingForSlot", "WaitingForGPUs", "WaitingForMemory", "WaitingForCPUs"}
)
_ERRORISH = re.compile(
    r"(?i)(error|\berr!|exception|traceback|\bfatal\b|\bfailed\b|\bfailure\b|\bpanic\b|killed|denied|"
    r"not found|no such file|segmentation fault|out of memory|\boom\b|\bassert)"
)


def triage_suggestion(
    run: dict[str, Any], detail: Mapping[str, Any] | None = None, queue: Mapping[str, Any] | None = None
) -> str:
    """A one-line next step for ``run`` (a run object), from its phase and
    reason; with its ``show`` document (``detail``) and the queue view
    (``queue``) the step names the figures (supervisord.client.cli.triage_hints):
    the peak and limit of a run stopped for its memory, the timeout it hit,
    the reservation a run waiting for GPUs waits behind."""
    phase, reason = run.get("phase"), run.get("reason")
    specific: str | None = None
    if reason == "OOMKilled" and run.get("backend") == "local":
        specific = oom_hint(run, detail) or _LOCAL_OOM
    elif reason == "DeadlineExceeded":
        specific = deadline_hint(run, detail)
    elif phase == "QUEUED" and reason == "WaitingForGPUs" and queue is not None:
        res = reservation_hint(run, detail, queue)
        specific = f"{_SUGGESTIONS[reason]}; {res}" if res else None
    if specific:
        return specific
    if reason and reason in _SUGGESTIONS:
        return _SUGGESTIONS[reason]
    if phase == "COMPLETED":
        return "the run completed: read its logs for results"
    if phase in ACTIVE_PHASES:
        return f"the run is {phase}: `wait` for it (after_seq={run.get('last_seq')})"
    if phase == "CANCELED":
        return "the run was canceled; submit again if it should run"
    if reason:
        return f"the run ended {phase} ({reason}): read message and error_lines for the cause"
    return f"the run ended {phase}: read message and error_lines for the cause"


# -- the tools -----------------------------------------------------------------


def _ref_error(field: str, err: JobsupError) -> ToolError:
    return ToolError(f"{field}: {err}")


class JobsupTools:
    """The tools' implementations over one :class:`Client` (blocking calls;
    the server runs them in worker threads)."""

    def __init__(self, client: Client, *, cwd: Path | None = None) -> None:
        self.client = client
        self.cwd = cwd or Path.cwd()

    # helpers
    def _path(self, raw: str | None) -> Path:
        p = Path(raw).expanduser() if raw else self.cwd
        return p if p.is_absolute() else self.cwd / p

    def _run(self, field: str, ref: str) -> dict[str, Any]:
        try:
            return dict(self.client.show(ref))
        except (RunNotFoundError, AmbiguousRunError) as err:
            raise _ref_error(field, err) from None

    def submit(self, args: dict[str, Any]) -> dict[str, Any]:
        """Submit a run: the same request as ``jobsup submit`` (scheduling
        options in the task, ``hold`` in the body, a ``request_id`` and the
        server's umask)."""
        from supervisord.client.cli.submit_request import build_task, submit_body

        cwd = self._path(args.get("cwd"))
        if not cwd.is_dir():
            raise ToolError(f"cwd: {cwd} is not a folder")
        task_file = args.get("task_file")
        sched = {k: args[k] for k in _SCHEDULING_FIELDS if k != "hold" and args.get(k) not in (None, [])}
        from supervisord.shared.sweep import check_grid, check_labels, check_max_parallel, check_placeholders

        grid = check_grid(args["sweep"], what="sweep") if args.get("sweep") is not None else None
        max_parallel = check_max_parallel(args.get("max_parallel"), what="max_parallel")
        labels = check_labels(args["labels"]) if args.get("labels") is not None else None
        task = build_task(
            cwd / task_file if task_file else None,
            args.get("command"),
            name=args.get("name"),
            backend=args.get("backend"),
            timeout=args.get("timeout"),
            manifest=args.get("manifest"),
            env=dict(args.get("env") or {}),
            scheduling=sched or None,
            flag_prefix="",
            sweep=grid,
            max_parallel=max_parallel,
            labels=labels,
        )
        if not task.run:
            raise TaskError("command: no command: give `command` or a task file with `run:`")
        if task.sweep:
            check_placeholders(task.run, task.name, task.sweep, what="sweep")
        elif task.max_parallel is not None:
            raise TaskError("max_parallel: only a sweep (`sweep`, or task `sweep:`) has runs to limit")
        body = submit_body(
            task,
            config_args=list(args.get("config") or []),
            cwd=cwd,
            rev=args.get("rev") or "HEAD",
            force=bool(args.get("force")),
            hold=bool(args.get("hold")),
            on_done=list(args["on_done"]) if args.get("on_done") else None,
        )
        result = self.client.submit(body)
        if task.sweep:
            return {
                "sweep": result["sweep"],
                "run_ids": list(result.get("run_ids") or []),
                "warnings": list(result.get("warnings") or []),
            }
        return {"run": result["run"], "warnings": list(result.get("warnings") or [])}

    def render(self, args: dict[str, Any]) -> dict[str, Any]:
        """What ``jobsup render -o json`` prints, with its notes and warnings
        (``backend: slurm``: ``jobsup render --backend slurm -o json`` under
        ``slurm``)."""
        from supervisord.client.cli.render_cmd import render_slurm, render_task

        cwd = self._path(args.get("cwd"))
        command = args.get("command")
        words = [command] if isinstance(command, str) else list(command or [])
        task_file = args.get("task_file")
        warnings: list[str] = []
        if args.get("backend") == "slurm":
            doc = render_slurm(
                str(cwd / task_file) if task_file else None,
                words,
                timeout=args.get("timeout"),
                run_id=args.get("run_id"),
                gpus=args.get("gpus"),
                memory=args.get("memory"),
                cpus=args.get("cpus"),
                config_items=list(args.get("config") or []),
                cwd=cwd,
                warn=warnings.append,
            )
            return {"objects": [], "notes": [], "warnings": warnings, "slurm": doc}
        for key in ("gpus", "memory", "cpus"):
            if args.get(key) is not None:
                raise UsageError(
                    f"{key}: a Kubernetes run's shape is its manifest; {key} renders only with backend slurm"
                )
        rendered = render_task(
            str(cwd / task_file) if task_file else None,
            words,
            manifest=args.get("manifest"),
            rev=args.get("rev") or "HEAD",
            timeout=args.get("timeout"),
            run_id=args.get("run_id"),
            name=args.get("name"),
            config_items=list(args.get("config") or []),
            cwd=cwd,
            warn=warnings.append,
        )
        return {
            "objects": json.loads(json.dumps(rendered.objects)),
            "notes": list(rendered.notes),
            "warnings": warnings,
        }

    def runs(self, args: dict[str, Any]) -> dict[str, Any]:
        """``jobsup runs -o json`` as ``{"runs": [...]}``."""
        return {
            "runs": self.client.runs(
                all=bool(args.get("all")),
                project=args.get("project"),
                phase=args.get("phase"),
                labels=args.get("labels"),
                name=args.get("name"),
                sweep=args.get("sweep"),
            )
        }

    def sweep(self, args: dict[str, Any]) -> dict[str, Any]:
        """``jobsup runs --sweep S -o json`` (sorted by ``sort`` when given)."""
        from supervisord.shared.sweeptable import flat_rows, sort_rows, table_columns

        try:
            doc = self.client.sweep(args["sweep"])
        except (RunNotFoundError, AmbiguousRunError) as err:
            raise _ref_error("sweep", err) from None
        if args.get("sort"):
            try:
                order = {r["id"]: i for i, r in enumerate(sort_rows(flat_rows(doc), args["sort"], table_columns(doc)))}
            except UsageError as err:
                raise ToolError(f"sort: {err}") from None
            doc["rows"] = sorted(doc["rows"], key=lambda r: order[r["id"]])
        return doc

    def show(self, args: dict[str, Any]) -> dict[str, Any]:
        """``jobsup show RUN -o json``."""
        from supervisord.client.cli.reads import show_document

        return show_document(self._run("run", args["run"]))

    def _lines(
        self, ref: str, *, tail: int | None = None, after_line: int = 0, attempt: int | None = None
    ) -> Generator[dict[str, Any], None, None]:
        try:
            for obj in self.client.logs(ref, follow=False, tail=tail, after_line=after_line, attempt=attempt):
                if "line_no" in obj:
                    yield obj
        except (RunNotFoundError, AmbiguousRunError) as err:
            raise _ref_error("run", err) from None

    def logs(self, args: dict[str, Any]) -> dict[str, Any]:
        """Stored lines, capped at ``max_bytes`` of text (UTF-8); a line
        longer than the cap comes in pieces (``next_byte``)."""
        run = self._run("run", args["run"])["run"]
        tail, first, last = args.get("tail"), args.get("from_line"), args.get("to_line")
        offset = int(args.get("from_byte") or 0)
        if tail is not None and (first is not None or last is not None):
            raise ToolError("tail: give either tail or from_line/to_line, not both")
        if first is not None and last is not None and last < first:
            raise ToolError(f"to_line: {last} is before from_line {first}")
        if offset and first is None:
            raise ToolError("from_byte: give it with from_line (the next_line and next_byte of the last answer)")
        cap = int(args.get("max_bytes") or LOGS_DEFAULT_BYTES)
        lines: list[dict[str, Any]] = []
        used, truncated, next_line, next_byte = 0, False, None, None
        stream = self._lines(run["id"], tail=tail, after_line=(first - 1) if first else 0, attempt=args.get("attempt"))
        try:
            for obj in stream:
                if last is not None and obj["line_no"] > last:
                    break
                text = obj["text"]
                if offset and obj["line_no"] == first:
                    text = text.encode()[_char_start(text.encode(), offset) :].decode("utf-8")
                size = len(text.encode()) + 1
                if used + size > cap:
                    truncated = True
                    if lines:
                        next_line = obj["line_no"]
                        break
                    # One line longer than the cap: a piece of it, and the
                    # cursor points inside the line, after that piece.
                    whole = obj["text"].encode()
                    begin = len(whole) - len(text.encode())
                    end = _piece_end(whole, begin, cap - 1)
                    text = whole[begin:end].decode("utf-8")
                    next_line, next_byte = (obj["line_no"], end) if end < len(whole) else (obj["line_no"] + 1, None)
                    size = cap
                used += size
                line = {"line_no": obj["line_no"], "stream": obj["stream"], "text": text}
                if "attempt" in obj:
                    line["attempt"] = obj["attempt"]
                lines.append(line)
                if next_line is not None:
                    break
        finally:
            stream.close()
        return {
            "run_id": run["id"],
            "lines": lines,
            "total_lines": run["log_lines"],
            "truncated": truncated,
            "next_line": next_line,
            "next_byte": next_byte,
        }

    def wait_slice(
        self, refs: list[str], cond: str, after: int | None, timeout_s: float
    ) -> tuple[int | None, dict[str, Any]]:
        """One ``GET /wait`` of at most ``timeout_s``: ``(cursor, result)``."""
        cursor: int | None = after
        result: dict[str, Any] = {}
        try:
            for obj in self.client.wait(refs, for_=cond, after=after, timeout=timeout_s):
                if "after" in obj and cursor is None:
                    cursor = int(obj["after"])
                if "result" in obj:
                    result = obj["result"]
                    break
        except (RunNotFoundError, AmbiguousRunError) as err:
            raise _ref_error("runs", err) from None
        if not result:
            raise DaemonUnreachableError("the daemon closed the wait stream before answering")
        return cursor, result

    def cancel(self, args: dict[str, Any]) -> dict[str, Any]:
        """Cancel each run (all refs resolved first, so a bad one cancels none)."""
        from supervisord.shared.sweep import is_sweep_ref

        ids, sweeps = [], []
        for i, ref in enumerate(args["runs"]):
            if is_sweep_ref(ref):
                try:
                    sweeps.append(self.client.sweep(ref)["sweep"]["id"])
                except (RunNotFoundError, AmbiguousRunError) as err:
                    raise _ref_error(f"runs[{i}]", err) from None
            else:
                ids.append(self._run(f"runs[{i}]", ref)["run"]["id"])
        # One request: the daemon stops them all together.
        return {"runs": self.client.cancel_many([*ids, *sweeps])}

    def _ids(self, args: dict[str, Any]) -> list[str]:
        """Every ref of ``args["runs"]`` resolved first (a bad one does nothing)."""
        return list(dict.fromkeys(self._run(f"runs[{i}]", ref)["run"]["id"] for i, ref in enumerate(args["runs"])))

    def _queued(self, args: dict[str, Any], action: str) -> list[str]:
        ids = self._ids(args)
        for i, rid in enumerate(ids):
            phase = self.client.show(rid)["run"]["phase"]
            if phase != "QUEUED":
                raise ToolError(f"runs[{i}]: run {rid} is {phase}: only a queued run can be {action}; nothing was done")
        return ids

    def hold(self, args: dict[str, Any]) -> dict[str, Any]:
        """Hold each queued run (all checked first)."""
        return {"runs": [self.client.hold(rid) for rid in self._queued(args, "held")]}

    def release(self, args: dict[str, Any]) -> dict[str, Any]:
        """Release each queued run (all checked first)."""
        return {"runs": [self.client.release(rid) for rid in self._queued(args, "released")]}

    def pause(self, args: dict[str, Any]) -> dict[str, Any]:
        """Pause each run (all refs resolved first)."""
        return {"runs": [self.client.pause(rid) for rid in self._ids(args)]}

    def resume(self, args: dict[str, Any]) -> dict[str, Any]:
        """Resume each run (all refs resolved first)."""
        return {"runs": [self.client.resume(rid) for rid in self._ids(args)]}

    def update(self, args: dict[str, Any]) -> dict[str, Any]:
        """``jobsup update -o json``: the daemon checks every run first."""
        keys = ("priority", "gpus", "queue", "timeout", "memory", "cpus")
        changes = {k: args[k] for k in keys if args.get(k) is not None}
        if not changes:
            raise ToolError("priority: give at least one of priority, gpus, queue, timeout, memory, cpus")
        return self.client.update(self._ids(args), changes)

    def rerun(self, args: dict[str, Any]) -> dict[str, Any]:
        """``jobsup rerun``: the daemon's answer (the new run, its dependents)."""
        run_id = self._run("run", args["run"])["run"]["id"]
        body: dict[str, Any] = {
            "env": dict(args.get("env") or {}),
            "hold": bool(args.get("hold")),
            "force": bool(args.get("force")),
            "with_dependents": bool(args.get("with_dependents")),
        }
        for key in ("rev", "command"):
            if args.get(key) is not None:
                body[key] = args[key]
        return self.client.rerun(run_id, body)

    def events(self, args: dict[str, Any]) -> dict[str, Any]:
        """A page of at most ``limit`` events after ``after_seq``."""
        ref = args.get("run")
        run_id = self._run("run", ref)["run"]["id"] if ref else None
        after, limit = int(args.get("after_seq") or 0), int(args.get("limit") or 100)
        out: list[dict[str, Any]] = []
        more = False
        stream = self.client.events(run=run_id, after=after, follow=False)
        try:
            for ev in stream:
                if "seq" not in ev:
                    continue
                if len(out) == limit:
                    more = True
                    break
                out.append(ev)
        finally:
            getattr(stream, "close", lambda: None)()
        return {"events": out, "last_seq": out[-1]["seq"] if out else after, "more": more}

    def outputs(self, args: dict[str, Any]) -> dict[str, Any]:
        """``jobsup outputs RUN -o json``."""
        return dict(self.client.outputs(str(args["run"])))

    def which(self, args: dict[str, Any]) -> dict[str, Any]:
        """``jobsup which FILE... -o json``: each item a path (hashed here) or a sha256."""
        from supervisord.shared.outputscan import sha256_file

        names, digests = [], []
        for item in args["files"]:
            item = str(item)
            if re.fullmatch(r"(sha256:)?[0-9a-fA-F]{64}", item) and not os.path.exists(item):
                digests.append(item.lower().removeprefix("sha256:"))
            else:
                try:
                    digests.append(sha256_file(item)[0])
                except OSError as err:
                    raise ToolError(f"files: {item}: {err.strerror or err}") from None
            names.append(item)
        doc = self.client.which(digests)
        return {"files": [{"file": n, **e} for n, e in zip(names, doc.get("files") or [], strict=True)]}

    def queue(self, args: dict[str, Any]) -> dict[str, Any]:
        """``jobsup queue -o json``: ``{"waiting", "gpus", "queues"}``."""
        return dict(self.client.queue())

    def top(self, args: dict[str, Any]) -> dict[str, Any]:
        """``jobsup top -o json``: the running local runs' usage now."""
        return dict(self.client.top())

    def doctor(self, args: dict[str, Any]) -> dict[str, Any]:
        """The daemon's checks (a failing check is data, not a tool error)."""
        try:
            checks = self.client.doctor()
        except DaemonUnreachableError as err:
            checks = [{"name": "daemon", "ok": False, "detail": str(err)}]
        return {"checks": checks, "ok": all(c.get("ok") for c in checks)}

    def triage(self, args: dict[str, Any]) -> dict[str, Any]:
        """Phase, reason, message, exit code, error-looking lines, pending
        reason, suggestion."""
        detail = self._run("run", args["run"])
        run = detail["run"]
        waits_for_gpus = run.get("phase") == "QUEUED" and run.get("reason") == "WaitingForGPUs"
        queue = self.client.queue() if waits_for_gpus else None
        scanned = list(self._lines(run["id"], tail=TRIAGE_SCAN_LINES)) if run["log_lines"] else []
        trimmed = [{"line_no": o["line_no"], "stream": o["stream"], "text": o["text"][:2000]} for o in scanned]
        errors = [o for o in trimmed if _ERRORISH.search(o["text"])]
        if not errors and run["phase"] == "ERROR":
            errors = [o for o in trimmed if o["stream"] == "stderr"]
        pending = run["reason"] if run["phase"] == "QUEUED" and run["reason"] in _PENDING_REASONS else None
        if run["phase"] == "QUEUED" and pending is None and run.get("reason"):
            pending = run["reason"]
        return {
            "run": run,
            "phase": run["phase"],
            "reason": run["reason"],
            "message": run["message"],
            "exit_code": run["exit_code"],
            "error_lines": errors[-TRIAGE_ERROR_LINES:],
            "last_lines": trimmed[-5:],
            "pending_reason": pending,
            "suggestion": triage_suggestion(run, detail, queue),
        }


# -- the server ----------------------------------------------------------------


def _text_result(structured: dict[str, Any]) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(text=json.dumps(structured, ensure_ascii=False))], structured_content=structured
    )


def _error_result(message: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=message)], is_error=True)


class Handlers:
    """The server's request handlers over one :class:`JobsupTools`.

    ``waits`` is the limiter of ``wait`` slices: its borrowed tokens are the
    wait slices still running (an abandoned slice keeps its token until it ends).
    """

    def __init__(self, tools: JobsupTools) -> None:
        self.tools = tools
        self.calls = anyio.CapacityLimiter(4)
        # Abandoned wait slices keep their token until they end (one slice).
        self.waits = anyio.CapacityLimiter(32)

    async def list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[t.to_mcp() for t in TOOLS])

    async def call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        name, args = params.name, dict(params.arguments or {})
        if name not in _BY_NAME:
            return _error_result(f"tool: no tool {name!r}; use one of {', '.join(_BY_NAME)}")
        problem = _input_problem(name, args)
        if problem is not None:
            return _error_result(problem)
        try:
            try:
                out = await self._call(name, args)
            except DaemonUnreachableError:
                if name == "submit":
                    raise  # not retried: the first attempt may have been recorded
                # The daemon went away (a restart): reconnect, starting one
                # when allowed, and try once more.
                await anyio.to_thread.run_sync(self.tools.client.connect, limiter=self.calls)
                out = await self._call(name, args)
        except ToolError as err:
            return _error_result(str(err))
        except JobsupError as err:
            return _error_result(str(err))
        except Exception as err:  # a defect: still one line for the agent, and logged
            log.exception("tool failed", tool=name)
            return _error_result(f"{name}: jobsup failed: {err!r}")
        return _text_result(out)

    async def _call(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        if name == "wait":
            return await self._wait(args)
        method: Callable[[dict[str, Any]], dict[str, Any]] = getattr(self.tools, name)
        return await anyio.to_thread.run_sync(method, args, limiter=self.calls)

    async def _wait(self, args: dict[str, Any]) -> dict[str, Any]:
        refs = list(args["runs"])
        cond = str(args.get("for") or "terminal")
        timeout_s = float(args.get("timeout_s", 60))
        after: int | None = args.get("after_seq")
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = max(0.0, deadline - time.monotonic())
            step = min(WAIT_SLICE_S, remaining)
            cursor, result = await anyio.to_thread.run_sync(
                self.tools.wait_slice, refs, cond, after, step, limiter=self.waits, abandon_on_cancel=True
            )
            after = cursor if after is None else after
            runs = list(result.get("runs") or [])
            met = bool(result.get("met"))
            if met or time.monotonic() >= deadline:
                seen = max([int(r.get("last_seq") or 0) for r in runs] + [after or 0])
                code = (0 if cond == "change" else _wait_exit_code(cond, runs)) if met else EXIT_WAIT_TIMEOUT
                return {
                    "outcome": "met" if met else "timeout",
                    "for": cond,
                    "runs": runs,
                    "after_seq": seen,
                    "exit_code": code,
                }


def _wait_exit_code(cond: str, runs: list[dict[str, Any]]) -> int:
    target = cond.upper()
    for r in runs:
        if cond == "terminal" or r["phase"] != target:
            code = exit_code_for_phase(r["phase"])
            if code != 0:
                return code
    return 0


def build_server(handlers: Handlers) -> Server[Any]:
    """The MCP server (low-level SDK API) serving ``handlers``' tools."""
    from importlib.metadata import version

    server: Server[Any] = Server(
        "jobsup",
        version=version("jobsup"),
        instructions=(
            "jobsup runs jobs (local processes or Kubernetes Jobs) from git repositories and records every event. "
            "Submit, then `wait` with after_seq (the run's last_seq) for race-free waits; `triage` explains a failure."
        ),
        on_list_tools=handlers.list_tools,
        on_call_tool=handlers.call_tool,
    )
    # The SDK wraps every request in an OpenTelemetry span by default (a
    # no-op without an exporter, but not free); the SDK documents dropping it.
    server.middleware = [m for m in server.middleware if type(m).__name__ != "OpenTelemetryMiddleware"]
    return server


def serve() -> None:
    """Connect to (or start) the daemon, then serve MCP on stdin/stdout
    until the client closes stdin. Raises DaemonUnreachableError when no
    daemon answers and none may be started."""
    from supervisord.shared.logging import configure_logging

    configure_logging("warning")  # stderr: stdout carries the protocol
    client = Client()
    try:
        client.connect()
    except DaemonUnreachableError as err:
        # Serve anyway: each tool call says why it cannot reach the daemon
        # (and tries again), and `doctor` reports it.
        log.warning("no jobsup daemon yet", error=str(err))
    tools = JobsupTools(client, cwd=Path(os.getcwd()))
    server = build_server(Handlers(tools))

    async def main() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    try:
        anyio.run(main)
    finally:
        client.close()


def _char_start(data: bytes, offset: int) -> int:
    """``offset`` moved back to the first byte of the UTF-8 character it
    falls in (at most ``len(data)``)."""
    offset = min(max(offset, 0), len(data))
    while 0 < offset < len(data) and data[offset] & 0xC0 == 0x80:
        offset -= 1
    return offset


def _piece_end(data: bytes, begin: int, budget: int) -> int:
    """Where a piece of ``data`` from ``begin`` (a character start) of at
    most ``budget`` bytes ends, on a character boundary; at least one whole
    character when one is left (so a reader always moves forward)."""
    end = _char_start(data, begin + max(budget, 0))
    if end <= begin < len(data):
        end = begin + 1
        while end < len(data) and data[end] & 0xC0 == 0x80:
            end += 1
    return end
