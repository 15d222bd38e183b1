"""The fast path's grammar is derived from the click commands: every
argument list built from a command's click parameters is either left to
click (``parse`` returns None) or parsed exactly as click parses it; and
every option the fast path knows is one of the click command's, with the
same parameter name and kind. A flag added to a click command, or a
changed type, cannot drift from the fast path unnoticed."""

from __future__ import annotations

import itertools
from typing import Any

import click
import pytest

from supervisord.client.cli import fast
from supervisord.client.cli.main import cli

#: The commands the fast path handles, with the arguments each needs.
FAST_COMMANDS: dict[str, tuple[list[str], list[str]]] = {
    # name: (words before the options, words after them)
    "runs": ([], []),
    "show": (["abcd"], []),
    "wait": (["abcd", "ef01"], []),
    "logs": (["abcd"], []),
    "submit": ([], ["--", "python", "train.py"]),
}

#: Values tried for an option that takes one (besides a Choice's choices).
SAMPLES = ["x", "5", "007", "1000", "1001", "-1", "+3", "", "0", "HEAD", "K=V", "json", "\u0663"]


def _command(name: str) -> click.Command:
    command = cli.get_command(click.Context(cli), name)
    assert command is not None, name
    return command


def _fast_options(name: str) -> dict[str, tuple[str, str]]:
    """The fast path's option strings for ``name``: option -> (kind, dest)."""
    if name == "submit":
        out = {o: ("value", d) for o, d in fast.SUBMIT_VALUES.items()}
        out |= {o: ("multiple", d) for o, d in fast.SUBMIT_MULTIPLE.items()}
        return out | {o: ("flag", d) for o, d in fast.SUBMIT_FLAGS.items()}
    takes_value, flags, _, _ = fast._GRAMMAR[name]
    return {o: ("value", d) for o, d in takes_value.items()} | {o: ("flag", d) for o, d in flags.items()}


def _click_options(command: click.Command) -> dict[str, click.Option]:
    return {opt: p for p in command.params if isinstance(p, click.Option) for opt in (*p.opts, *p.secondary_opts)}


def test_fast_commands_are_the_ones_tested() -> None:
    assert set(fast._GRAMMAR) | {"submit"} == set(FAST_COMMANDS)
    assert set(fast._RUN) == set(FAST_COMMANDS)


@pytest.mark.parametrize("name", sorted(FAST_COMMANDS))
def test_every_fast_option_is_the_click_option(name: str) -> None:
    options = _click_options(_command(name))
    for opt, (kind, dest) in _fast_options(name).items():
        assert opt in options, f"{name} {opt}: the fast path takes an option click does not have"
        param = options[opt]
        assert param.name == dest, (name, opt, param.name, dest)
        assert param.is_flag == (kind == "flag"), (name, opt)
        assert param.multiple == (kind == "multiple"), (name, opt)


def _option_words(param: click.Option) -> list[list[str]]:
    """Ways to give ``param`` on a command line (values valid or not)."""
    values = list(param.type.choices) if isinstance(param.type, click.Choice) else []
    values += SAMPLES
    forms: list[list[str]] = []
    for opt in param.opts + param.secondary_opts:
        if param.is_flag:
            forms += [[opt], [opt, opt], [f"{opt}=1"]]
            continue
        for value in values:
            forms.append([opt, value])
            forms.append([f"{opt}={value}"] if opt.startswith("--") else [f"{opt}{value}"])
        forms += [[opt], [opt, values[0], opt, values[-1]]]
    return forms


def _cases(name: str) -> list[list[str]]:
    command = _command(name)
    before, after = FAST_COMMANDS[name]
    params = [p for p in command.params if isinstance(p, click.Option)]
    singles = [words for p in params for words in _option_words(p)]
    cases = [[name, *before, *after]]
    cases += [[name, *before, *words, *after] for words in singles]
    # Two options together, in both orders (a sample: each option's first two forms).
    firsts = [words for p in params for words in _option_words(p)[:2]]
    cases += [[name, *before, *a, *b, *after] for a, b in itertools.permutations(firsts, 2)]
    # Without the arguments it needs, and with one too many.
    cases += [[name, *after], [name, *before, "extra", *after], [name, "--help", *before, *after]]
    return cases


def _default(param: click.Parameter, ctx: click.Context) -> Any:
    value = param.get_default(ctx)
    return tuple(value) if isinstance(value, list) else value


@pytest.mark.parametrize("name", sorted(FAST_COMMANDS))
def test_fast_path_parses_as_click_or_leaves_it(name: str) -> None:
    command = _command(name)
    parsed = 0
    for argv in _cases(name):
        got = fast.parse(argv)
        if got is None:
            continue  # click answers, as it always did
        parsed += 1
        _, options, args = got
        try:
            ctx = command.make_context(name, list(argv[1:]))
        except click.exceptions.Exit:
            pytest.fail(f"{argv}: the fast path runs what click answers itself (--help)")
        except click.ClickException as err:
            pytest.fail(f"{argv}: the fast path takes what click refuses: {err.format_message()}")
        options = dict(options)
        if name == "submit":
            assert options.pop("command") == ctx.meta["jobsup.command"], argv
        for param in command.params:
            assert param.name is not None
            value = ctx.params.get(param.name)
            if isinstance(param, click.Argument):
                want = tuple(args) if param.nargs != 1 else (args[0] if args else None)
                if param.name == "task_file":
                    want = None
                assert value == want, (argv, param.name, value, want)
            elif param.name in options:
                mine = options[param.name]
                assert value == (tuple(mine) if isinstance(mine, list) else mine), (argv, param.name, value, mine)
            else:
                assert value in (None, False, (), _default(param, ctx)), (argv, param.name, value)
    assert parsed > len(FAST_COMMANDS[name]), f"{name}: the fast path took almost nothing"
