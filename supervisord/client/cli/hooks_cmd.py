"""``jobsup hooks``: the daemon's hooks with their checkpoints, lag and last outcome."""

from __future__ import annotations

from typing import Any

import click

from supervisord.client.cli.output import emit, info, output_option, warn
from supervisord.client.cli.reads import connected_client

__all__ = ["hooks"]

_COLUMNS = ("name", "kind", "when", "target", "checkpoint", "lag", "last")
#: The table shows at most this much of a hook's command or URL (`-o json`: all of it).
_TARGET_WIDTH = 60


def _short(text: str | None) -> str | None:
    if text is None or len(text) <= _TARGET_WIDTH:
        return text
    return text[: _TARGET_WIDTH - 1] + "…"


def _last(outcome: dict[str, Any] | None) -> str | None:
    """``HookDelivered seq 41 (attempt 1)`` / ``HookFailed seq 41: HTTP 500 (attempt 2, will retry)``."""
    if not outcome:
        return None
    text = f"{outcome.get('type')} seq {outcome.get('event_seq')}"
    if outcome.get("error"):
        text += f": {outcome['error']}"
    text += f" (attempt {outcome.get('attempt')}{'' if outcome.get('final', True) else ', will retry'})"
    return text


@click.command("hooks")
@output_option()
def hooks(output: str) -> None:
    """List the daemon's hooks: checkpoint (last event seq finished with),
    lag (events after it) and the last outcome this daemon recorded."""
    doc = connected_client().hooks_doc()
    rows = list(doc["hooks"])
    for message in doc.get("config_changed") or []:
        warn(message)
    if output != "table":
        emit(rows, output)
        return
    if not rows:
        info("no hooks")
        return
    table = [
        {
            **r,
            "when": ",".join(r.get("when") or []),
            "target": _short(" ".join(r["target"]) if isinstance(r.get("target"), list) else r.get("target")),
            "last": _last(r.get("last_outcome")),
        }
        for r in rows
    ]
    emit(table, "table", columns=_COLUMNS)
