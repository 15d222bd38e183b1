"""Reading config YAML strictly: duplicate and non-string keys are errors
with their line, dates stay strings (config is JSON data). Used by the
config sources, ``--config KEY=VALUE`` parsing and task files.

The caps on what one YAML document may cost (:data:`MAX_YAML_BYTES` of
text, :data:`MAX_YAML_NODES` values once aliases are expanded, no recursive
alias) live here once: :class:`BoundedLoader` applies them to every
document it constructs, and :func:`check_yaml_size` checks the text. The
config loader and the Kubernetes manifest loader both build on them.
"""

from __future__ import annotations

from typing import Any, Final

import yaml
import yaml.constructor
import yaml.nodes
import yaml.resolver

from supervisord.shared.exceptions import ConfigError
from supervisord.shared.yamlerrors import describe_yaml_error

__all__ = [
    "MAX_YAML_BYTES",
    "MAX_YAML_NODES",
    "BoundedLoader",
    "ConfigLoader",
    "check_expansion",
    "check_yaml_size",
    "load_yaml",
]


#: The largest YAML document read as config or a task file (bytes of text).
MAX_YAML_BYTES = 4 * 1024 * 1024
#: The most nodes a document may have once its aliases are expanded: a few
#: aliases of aliases ("billion laughs") otherwise make a tiny file expand
#: to gigabytes in whatever walks the data next.
MAX_YAML_NODES = 200_000


def check_expansion(root: yaml.nodes.Node) -> None:
    """Raise ``yaml.constructor.ConstructorError`` when ``root`` (a composed
    document), with every alias expanded, has more than
    :data:`MAX_YAML_NODES` nodes or an alias refers to a node that contains
    it (counted once per distinct node: linear time)."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: yaml.nodes.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_nodes:
            raise yaml.constructor.ConstructorError(
                None, None, "an alias refers to a node that contains it (recursive alias)", node.start_mark
            )
        open_nodes.add(key)
        total = 1
        if isinstance(node, yaml.nodes.SequenceNode):
            total += sum(size(child) for child in node.value)
        elif isinstance(node, yaml.nodes.MappingNode):
            total += sum(size(k) + size(v) for k, v in node.value)
        open_nodes.discard(key)
        if total > MAX_YAML_NODES:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"the document expands to more than {MAX_YAML_NODES} values (aliases of aliases?); refusing it",
                node.start_mark,
            )
        sizes[key] = total
        return total

    size(root)


def check_yaml_size(text: str) -> str | None:
    """The problem with ``text`` as one YAML stream when it is longer than
    :data:`MAX_YAML_BYTES` characters (for the caller's error, which names
    the file), else None."""
    if len(text) > MAX_YAML_BYTES:
        return f"{len(text)} characters is over the limit of {MAX_YAML_BYTES} for a YAML document"
    return None


class BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader that refuses, before constructing anything, a
    document with more than :data:`MAX_YAML_NODES` values once its aliases
    are expanded or with a recursive alias (:func:`check_expansion`; a
    ``yaml.constructor.ConstructorError`` with the node's line). Subclass it
    for a stricter loader."""

    def construct_document(self, node: yaml.nodes.Node) -> Any:
        """Check ``node``'s expanded size, then construct it as SafeLoader does."""
        check_expansion(node)
        return super().construct_document(node)


class ConfigLoader(BoundedLoader):
    """PyYAML's safe loader, stricter: duplicate keys and non-string keys are
    errors (with their line), and dates stay strings (config is JSON data)."""


# Drop the timestamp resolver: `2024-01-01` stays the string it looks like.
ConfigLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


#: The mappings whose plain ``on`` key is the word "on" (YAML 1.1 reads it as
#: true): the one under a ``retry`` key (``retry: {attempts: 2, on: [Lost]}``,
#: supervisord.shared.retry). A hook's bare ``on:`` stays an error with its hint.
_ON_IS_A_WORD_UNDER: Final = frozenset({"retry"})


def _construct_mapping(loader: ConfigLoader, node: yaml.nodes.MappingNode) -> dict[Any, Any]:
    seen: set[str] = set()
    words: set[int] = loader.__dict__.setdefault("_on_is_a_word", set())
    for key_node, value_node in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        if (
            key is True
            and id(node) in words
            and isinstance(key_node, yaml.ScalarNode)
            and not key_node.style
            and key_node.value == "on"
        ):
            key = "on"
        if key in _ON_IS_A_WORD_UNDER and isinstance(value_node, yaml.MappingNode):
            words.add(id(value_node))
        if not isinstance(key, str):
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"the key {key!r} is not a string (a {type(key).__name__}); quote it"
                + (
                    " (YAML reads on/off/yes/no as booleans; a hook's phases go under `when:`)"
                    if isinstance(key, bool)
                    else ""
                ),
                key_node.start_mark,
            )
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    loader.flatten_mapping(node)
    pairs = loader.construct_pairs(node, deep=True)
    if id(node) in words:
        pairs = [("on" if k is True else k, v) for k, v in pairs]
    return dict(pairs)


ConfigLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_yaml(text: str, *, source: str) -> Any:
    """Parse ``text`` with :class:`ConfigLoader`. Raises ConfigError
    ``"<source>: line N: not valid YAML: <problem>"``, also for a document
    over :data:`MAX_YAML_BYTES`, one that expands to more than
    :data:`MAX_YAML_NODES` values, or one nested too deeply to parse."""
    too_large = check_yaml_size(text)
    if too_large is not None:
        raise ConfigError(f"{source}: {too_large}")
    try:
        return yaml.load(text, Loader=ConfigLoader)  # noqa: S506 - ConfigLoader is a SafeLoader
    except RecursionError:
        raise ConfigError(f"{source}: not valid YAML: nested too deeply") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: {describe_yaml_error(exc)}") from None
