"""The CLI's fast path: ``jobsup runs``, ``show``, ``wait``, ``logs`` and
``submit ... -- CMD`` in their common forms without importing click.

These are what scripts and agents call most, as a new process each time,
and importing click alone costs about a third of the 100 ms a call may
take (bench/cli_latency.py); ``jobsup logs RUN --tail 100`` should answer
about as fast as ``tail -n 100`` of a file (bench/local_logs_replay.py).
:func:`main` parses argument lists it is sure of exactly as the click
commands in :mod:`supervisord.client.cli.runs_cmd` would, and runs the same
bodies (:mod:`supervisord.client.cli.reads`): the output and exit codes are the
click path's. Anything else — ``--help``, an option it
does not know, a value click would check (``--phase``; ``--tail`` other
than ASCII digits), a repeated option, combined short flags (``-fo``),
``--``, a value that starts with ``-``, a non-UTF-8 argument — returns
None, and the caller hands the arguments to click, which then answers
(or reports the error) as it always did.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

__all__ = ["main", "parse"]

_OUTPUT = ("table", "json", "yaml")

#: command -> (options taking a value, flags, (least, most) arguments,
#: the ``-o`` choices, the first being the default).
_GRAMMAR: dict[str, tuple[dict[str, str], dict[str, str], tuple[int, int | None], tuple[str, ...]]] = {
    "runs": (
        {
            "-o": "output",
            "--output": "output",
            "--project": "project",
            "--sweep": "sweep",
            "--sort": "sort_key",
            "--name": "name",
        },
        {"--all": "all_", "--csv": "as_csv"},
        (0, 0),
        _OUTPUT,
    ),
    "show": ({"-o": "output", "--output": "output"}, {}, (1, 1), _OUTPUT),
    "wait": (
        {"-o": "output", "--output": "output", "--for": "for_", "--timeout": "timeout", "--after": "after"},
        {},
        (1, None),
        _OUTPUT,
    ),
    "logs": (
        {"-o": "output", "--output": "output", "--tail": "tail"},
        {"-f": "follow", "--follow": "follow"},
        (1, 1),
        ("text", "json"),
    ),
}

#: Options whose value is a count (click's ``IntRange(min=0)``): only
#: ASCII digits are taken here, anything else is left to click.
_COUNTS = ("after", "tail")


#: ``submit``: options taking one value, repeatable ones, flags (each
#: option string -> the click parameter's name). ``submit`` is handled only
#: with ``-- CMD...`` and no task file; ``--follow``, ``--sweep``,
#: ``--max-parallel`` and the hidden shape flags are left to click.
SUBMIT_VALUES: dict[str, str] = {
    "--backend": "backend",
    "--name": "name",
    "--timeout": "timeout",
    "--manifest": "manifest",
    "--rev": "rev",
    "--on-done": "on_done",
    "--gpus": "gpus",
    "--queue": "queue",
    "--priority": "priority",
    "--memory": "memory",
    "--cpus": "cpus",
}
SUBMIT_MULTIPLE: dict[str, str] = {
    "--env": "env_pairs",
    "--config": "config_args",
    "--label": "label_pairs",
    "--after": "after",
    "--after-any": "after_any",
    "--after-failed": "after_failed",
}
SUBMIT_FLAGS: dict[str, str] = {"--force": "force", "--hold": "hold"}
#: ``submit``'s options whose value click checks as a whole number in a
#: range: only ASCII digits within it are taken here.
_SUBMIT_COUNTS: dict[str, tuple[int, int]] = {"gpus": (0, 2**63), "priority": (0, 1000)}
_SCHEDULING = ("gpus", "queue", "priority", "after", "after_any", "after_failed", "memory", "cpus")


def _utf8(word: str) -> bool:
    try:
        word.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def parse_submit(rest: list[str]) -> dict[str, Any] | None:
    """The parameters of ``jobsup submit`` (``rest``: the words after
    ``submit``) as the click command would have them, the words after
    ``--`` as ``command``; None when this module leaves them to click (see
    :data:`SUBMIT_VALUES`)."""
    if "--" not in rest:
        return None
    cut = rest.index("--")
    words, command = rest[:cut], rest[cut + 1 :]
    if not command or not all(_utf8(w) for w in rest):
        return None
    options: dict[str, Any] = {}
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if not word.startswith("--"):
            return None  # a task file, -f, -h...
        name, eq, value = word.partition("=")
        if name in SUBMIT_FLAGS and not eq:
            key = SUBMIT_FLAGS[name]
            if key in options:
                return None
            options[key] = True
            continue
        if name not in SUBMIT_VALUES and name not in SUBMIT_MULTIPLE:
            return None
        if not eq:
            if i >= len(words) or words[i].startswith("-"):
                return None
            value = words[i]
            i += 1
        if name in SUBMIT_MULTIPLE:
            options.setdefault(SUBMIT_MULTIPLE[name], []).append(value)
            continue
        key = SUBMIT_VALUES[name]
        if key in options:
            return None
        options[key] = value
    from supervisord.shared.task import BACKENDS

    if options.get("backend", BACKENDS[0]) not in BACKENDS:
        return None
    for key, (low, high) in _SUBMIT_COUNTS.items():
        if key in options:
            text = options[key]
            if not (text.isascii() and text.isdigit()) or not low <= int(text) <= high:
                return None
            options[key] = int(text)
    options["command"] = command
    return options


def parse(argv: list[str]) -> tuple[str, dict[str, Any], list[str]] | None:
    """``(command, options, arguments)`` for an argument list this module
    runs, with the click commands' defaults filled in; None for any other."""
    if argv[:1] == ["submit"]:
        submit = parse_submit(argv[1:])
        return None if submit is None else ("submit", submit, [])
    if not argv or argv[0] not in _GRAMMAR:
        return None
    takes_value, flags, (least, most), outputs = _GRAMMAR[argv[0]]
    options: dict[str, Any] = {}
    args: list[str] = []
    rest = argv[1:]
    i = 0
    while i < len(rest):
        word = rest[i]
        i += 1
        try:
            word.encode("utf-8")
        except UnicodeEncodeError:
            return None
        if not word.startswith("-"):
            args.append(word)
            continue
        name, eq, value = word.partition("=") if word.startswith("--") else (word[:2], "", word[2:])
        given: bool | str
        if name in flags and not eq and not value:
            key, given = flags[name], True
        elif name in takes_value:
            if not eq and not value:
                if i >= len(rest) or rest[i].startswith("-"):
                    return None
                value = rest[i]
                i += 1
            key, given = takes_value[name], value
        else:
            return None  # --help, -h, --, an unknown option, -oVALUE of a flag...
        if key in options:
            return None
        options[key] = given
    if len(args) < least or (most is not None and len(args) > most):
        return None
    output = options.setdefault("output", outputs[0])
    if output not in outputs:
        return None
    for key in _COUNTS:
        if key in options:
            if not options[key].isdigit() or not options[key].isascii():
                return None
            options[key] = int(options[key])
    return argv[0], options, args


def _runs(options: dict[str, Any], args: list[str]) -> int:
    from supervisord.client.cli.reads import read_command, runs_command

    if options.get("sweep") is None:
        return read_command(
            lambda client: runs_command(
                client,
                all_=bool(options.get("all_")),
                project=options.get("project"),
                phase=None,
                output=options["output"],
                name=options.get("name"),
            )
        )
    from supervisord.client.cli.sweep_table import sweep_command
    from supervisord.shared.sweep import check_sweep_ref

    check_sweep_ref(options["sweep"])
    return read_command(
        lambda client: sweep_command(
            client,
            options["sweep"],
            name=options.get("name"),
            sort_key=options.get("sort_key"),
            as_csv=bool(options.get("as_csv")),
            output=options["output"],
        )
    )


def _show(options: dict[str, Any], args: list[str]) -> int:
    from supervisord.client.cli.reads import read_command, show_command
    from supervisord.shared.runref import check_run_refs

    check_run_refs(args)
    return read_command(lambda client: show_command(client, args[0], options["output"]))


def _wait(options: dict[str, Any], args: list[str]) -> int:
    from supervisord.client.cli.reads import connected_client, wait_command, wait_timeout_s
    from supervisord.shared.sweep import check_handles

    check_handles(args)
    timeout_s = wait_timeout_s(options.get("timeout"))
    return wait_command(
        connected_client(),
        args,
        for_=options.get("for_", "terminal"),
        timeout_s=timeout_s,
        after=options.get("after"),
        output=options["output"],
    )


def _logs(options: dict[str, Any], args: list[str]) -> int:
    from supervisord.client.cli.reads import connected_client, logs_command
    from supervisord.shared.runref import check_run_refs

    check_run_refs(args)
    return logs_command(
        connected_client(),
        args[0],
        follow=bool(options.get("follow")),
        tail=options.get("tail"),
        output=options["output"],
    )


def _submit(options: dict[str, Any], args: list[str]) -> int:
    from supervisord.client.cli.submit_run import submit_command

    given = dict(options)
    scheduling = {k: given.pop(k) for k in _SCHEDULING if k in given}
    return submit_command(
        None,
        given.pop("command"),
        hold=bool(given.pop("hold", False)),
        scheduling=scheduling,
        **given,
    )


_RUN: dict[str, Callable[[dict[str, Any], list[str]], int]] = {
    "submit": _submit,
    "runs": _runs,
    "show": _show,
    "wait": _wait,
    "logs": _logs,
}


def main(argv: list[str]) -> int | None:
    """Run ``argv`` (without the program name) and return its exit code, or
    None when this module does not handle it (see the module docstring).
    Errors are reported as the click path's ``main`` reports them: one
    ``error:`` line and exit 69, 2 or 1; ``aborted`` and 130 on Ctrl-C;
    when stdout's reader has gone, nothing more and the command's own exit
    code (:data:`~supervisord.client.cli.reads.EXIT_OUTPUT_CLOSED` when it was
    still writing)."""
    parsed = parse(argv)
    if parsed is None:
        return None
    command, options, args = parsed
    if command == "runs" and options.get("sweep") is None and ("sort_key" in options or "as_csv" in options):
        return None  # --sort / --csv without --sweep: click's error
    import sys

    from supervisord.client.cli.output import echo, writing
    from supervisord.client.cli.reads import EXIT_OUTPUT_CLOSED, output_closed
    from supervisord.shared.exceptions import JobsupError

    try:
        code = _RUN[command](options, args)
        with writing():  # what the buffer still holds fails here, not at exit
            sys.stdout.flush()
        return code
    except (KeyboardInterrupt, EOFError):
        echo("", err=True)
        echo("aborted", err=True)
        return 130
    except JobsupError as err:
        with contextlib.suppress(JobsupError):  # stderr may fail too
            echo(f"error: {err}", err=True)
        return err.exit_code
    except OSError as err:
        if not output_closed(err):
            raise
        return EXIT_OUTPUT_CLOSED
