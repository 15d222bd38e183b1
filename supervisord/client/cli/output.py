"""Output for the CLI: machine output on stdout, human messages on stderr.

Every listing command takes ``-o table|json|yaml`` (README, "Commands").
Importing this module does not import click (:mod:`supervisord.client.cli.fast`
uses it without click); :func:`echo` writes as ``click.echo`` does.
"""

from __future__ import annotations

import contextlib
import errno
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from supervisord.shared.exceptions import OutputError

__all__ = ["OUTPUT_FORMATS", "echo", "emit", "info", "output_option", "warn", "writing"]

OUTPUT_FORMATS = ("table", "json", "yaml")

F = TypeVar("F", bound=Callable[..., Any])


def output_option(*, default: str = "table", choices: Sequence[str] = OUTPUT_FORMATS) -> Callable[[F], F]:
    """The ``-o/--output`` click option, as every listing command takes it."""
    import click

    return click.option(
        "-o",
        "--output",
        "output",
        type=click.Choice(list(choices)),
        default=default,
        show_default=True,
        help="Output format.",
    )


def emit(data: Any, fmt: str, *, columns: Sequence[str] | None = None) -> None:
    """Write ``data`` to stdout as ``fmt``.

    ``table`` needs ``data`` to be a list of dicts (or one dict) and prints
    ``columns`` (default: the first row's keys) with rich when stdout is a TTY,
    plain aligned text otherwise. ``json`` is indented JSON; ``yaml`` is block
    YAML with keys in their given order.
    """
    if fmt == "json":
        echo(json.dumps(data, indent=2, ensure_ascii=False))
        return
    if fmt == "yaml":
        import yaml

        echo(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), nl=False)
        return
    rows = data if isinstance(data, list) else [data]
    if not rows:
        return
    cols = list(columns) if columns else list(rows[0].keys())
    cells = [[_cell(r.get(c)) for c in cols] for r in rows]
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.table import Table

        table = Table(box=None, pad_edge=False, header_style="bold")
        for c in cols:
            table.add_column(c.upper())
        for row in cells:
            table.add_row(*row)
        with writing():
            Console().print(table)
        return
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    echo("  ".join(c.upper().ljust(w) for c, w in zip(cols, widths, strict=True)).rstrip())
    for row in cells:
        echo("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def warn(message: str) -> None:
    """One warning line on stderr, prefixed ``warning:``."""
    echo(f"warning: {message}", err=True)


def info(message: str) -> None:
    """One human message line on stderr."""
    echo(message, err=True)


#: An ANSI escape sequence, as click strips them (``click._compat._ansi_re``).
_ANSI_PATTERN = r"\033\[[0-?]*[ -/]*[@-~]"


def echo(message: str, *, err: bool = False, nl: bool = True) -> None:
    """Write ``message`` (and a newline) to stdout, or stderr with ``err``,
    and flush: what ``click.echo`` does with a string, including removing
    ANSI escape sequences when the stream is not a terminal."""
    stream = sys.stderr if err else sys.stdout
    if "\033" in message and not stream.isatty():
        import re

        message = re.sub(_ANSI_PATTERN, "", message)
    with writing():
        stream.write(message + "\n" if nl else message)
        stream.flush()


@contextlib.contextmanager
def writing() -> Iterator[None]:
    """Write the command's output inside: an OSError other than a closed
    pipe (EPIPE, which the CLI's boundary ends quietly) is raised as
    :class:`~supervisord.shared.exceptions.OutputError`, ``cannot write output:
    <reason>``, with the OSError as its cause."""
    try:
        yield
    except OSError as err:
        if err.errno == errno.EPIPE:
            raise
        raise OutputError(f"cannot write output: {err.strerror or err}") from err
