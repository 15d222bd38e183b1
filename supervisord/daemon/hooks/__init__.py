"""Hooks: commands and webhooks run when a run reaches a phase, delivered at
least once from the event log (README.md, "Hooks").

- :mod:`supervisord.shared.hooksconfig`: the ``hooks:`` config model and its
  validation (daemon and user config only), and ``submit --on-done``.
- :mod:`supervisord.daemon.hooks.match`: which events a hook wants (pure).
- :mod:`supervisord.daemon.hooks.command` / :mod:`supervisord.daemon.hooks.webhook`: one
  delivery attempt each.
- :mod:`supervisord.daemon.hooks.delivery`: one subscription per hook with a
  checkpoint in the store; the outcome events ``HookDelivered`` and
  ``HookFailed``.

This package's ``__init__`` exports the config model only, so the CLI can
use it without loading the delivery machinery (httpx clients, processes).
"""

from supervisord.shared.hooksconfig import HookSpec, WebhookTarget, load_hooks, parse_on_done

__all__ = ["HookSpec", "WebhookTarget", "load_hooks", "parse_on_done"]
