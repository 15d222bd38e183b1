"""One wording for YAML that does not parse, wherever jobsup reads YAML
(config layers, task files, ``--config`` values, kubeconfigs, Kubernetes
manifests): ``line N, column M: not valid YAML: <what PyYAML found>``.
"""

from __future__ import annotations

import yaml

__all__ = ["describe_yaml_error"]


def describe_yaml_error(exc: yaml.YAMLError, *, document: int | None = None) -> str:
    """``[document D, ]line N, column M: not valid YAML: <problem>`` for a
    PyYAML error (the location is left out when PyYAML gives none; the
    problem is preceded by PyYAML's context, "while parsing a block
    mapping", when it gives one, except for a duplicate key). The caller
    prefixes the file or source."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = [f"document {document}"] if document is not None else []
    if mark is not None:
        where.append(f"line {mark.line + 1}, column {mark.column + 1}")
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    detail = f"{context}: {problem}" if context and "duplicate" not in problem else problem
    return (", ".join(where) + ": " if where else "") + f"not valid YAML: {detail}"
