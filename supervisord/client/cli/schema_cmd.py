"""``jobsup schema [NAME]``: the JSON Schemas of jobsup's ``-o json`` output.

Needs no daemon: the schemas ship inside the package
(:mod:`supervisord.shared.schemas`).
"""

from __future__ import annotations

import json

import click

from supervisord.client.cli.output import echo

__all__ = ["schema"]


@click.command("schema")
@click.argument("name", required=False)
def schema(name: str | None) -> None:
    """Print the JSON Schema (draft 2020-12) called NAME; without NAME, list
    the names, one a line, with what each describes."""
    from supervisord.shared import schemas

    if name is None:
        for n in schemas.names():
            title = str(schemas.load(n).get("title") or "")
            echo(f"{n}\t{title}")
        return
    echo(json.dumps(schemas.load(name), indent=2, ensure_ascii=False))
