"""Hooks: commands and webhooks run when a run reaches a phase, delivered at
least once from the event log (README.md, "Hooks").

- :mod:`supervisord.hooks.config`: the ``hooks:`` config model and its
  validation (daemon and user config only), and ``submit --on-done``.
- :mod:`supervisord.hooks.match`: which events a hook wants (pure).
- :mod:`supervisord.hooks.command` / :mod:`supervisord.hooks.webhook`: one
  delivery attempt each.
- :mod:`supervisord.hooks.delivery`: one subscription per hook with a
  checkpoint in the store; the outcome events ``HookDelivered`` and
  ``HookFailed``.

This package's ``__init__`` exports the config model only, so the CLI can
use it without loading the delivery machinery (httpx clients, processes).
"""

from supervisord.hooks.config import HookSpec, WebhookTarget, load_hooks, parse_on_done

__all__ = ["HookSpec", "WebhookTarget", "load_hooks", "parse_on_done"]
