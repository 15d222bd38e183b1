"""Reading config YAML strictly: duplicate and non-string keys are errors
with their line, dates stay strings (config is JSON data). Used by the
config sources, ``--config KEY=VALUE`` parsing and task files.
"""

from __future__ import annotations

from typing import Any

import yaml
import yaml.constructor
import yaml.nodes
import yaml.resolver

from supervisord.exceptions import ConfigError

__all__ = ["ConfigLoader", "load_yaml"]


class ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader, stricter: duplicate keys and non-string keys are
    errors (with their line), and dates stay strings (config is JSON data)."""


# Drop the timestamp resolver: `2024-01-01` stays the string it looks like.
ConfigLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _construct_mapping(loader: ConfigLoader, node: yaml.nodes.MappingNode) -> dict[Any, Any]:
    seen: set[str] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, str):
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"the key {key!r} is not a string (a {type(key).__name__}); quote it",
                key_node.start_mark,
            )
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    loader.flatten_mapping(node)
    return dict(loader.construct_pairs(node, deep=True))


ConfigLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_yaml(text: str, *, source: str) -> Any:
    """Parse ``text`` with :class:`ConfigLoader`. Raises ConfigError
    ``"<source>: line N: not valid YAML: <problem>"``."""
    try:
        return yaml.load(text, Loader=ConfigLoader)  # noqa: S506 - ConfigLoader is a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}:" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{source}:{where} not valid YAML: {problem}") from None
