"""Reading a kubeconfig's ``current-context``, the one reader the config
machinery (which context's settings apply) and the Kubernetes backend
(which cluster to use) share. The files come from the caller: the config
machinery finds them (``KUBECONFIG``, else ``~/.kube/config``:
:func:`supervisord.shared.config.sources.kubeconfig_files`), the backend gets
them from the daemon.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import yaml

from supervisord.shared.exceptions import ConfigError
from supervisord.shared.yamlerrors import describe_yaml_error

__all__ = ["current_context"]


def current_context(files: Iterable[Path]) -> str | None:
    """The ``current-context`` of the kubeconfig ``files``, as kubectl
    merges them: the first file that sets one wins; missing files are
    skipped. None when none sets one. Blocks (reads files). Raises
    ConfigError naming a file that cannot be read or is not valid YAML."""
    for file in files:
        if not file.is_file():
            continue
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{file}: cannot read kubeconfig: {exc}") from None
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{file}: kubeconfig: {describe_yaml_error(exc)}") from None
        name = doc.get("current-context") if isinstance(doc, dict) else None
        if isinstance(name, str) and name:
            return name
    return None
