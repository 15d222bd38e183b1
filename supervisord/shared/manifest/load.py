"""Reading the Kubernetes manifest: from the recorded commit, token, YAML.

The manifest is the run's shape (image, resources, GPUs, volumes); it is read
from the recorded commit (``git show COMMIT:PATH``), never from the working
tree, so uncommitted edits never run (docs/kubernetes.md, "Where the
manifest comes from").

Text handling, in order:

1. :func:`substitute_run_token` replaces every ``{{JOBSUP_RUN}}`` with the run
   id, as plain text, before any parsing: the token works in names, labels,
   commands, anywhere.
2. :func:`parse_manifest` reads one or more YAML documents (``---``
   separated); a document of ``kind: List`` is replaced by its ``items``; order
   is kept; empty documents are skipped (as ``kubectl`` does).

The YAML loader is PyYAML's safe loader with two changes that match how the
Kubernetes API machinery reads YAML: timestamps stay strings (``2024-01-01``
is not turned into a date), and a mapping key given twice is an error naming
both lines (``kubectl`` rejects duplicate keys too). It has the same caps as
config files (:mod:`supervisord.shared.config.yamlload`: the text's size, the
values a document expands to through its aliases, no recursive alias), so
a cloned repository's manifest cannot make a submit or ``jobsup render``
hang or run out of memory ("billion laughs").
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from supervisord.shared.config.yamlload import BoundedLoader, check_yaml_size
from supervisord.shared.exceptions import ManifestError
from supervisord.shared.source import read_file_at
from supervisord.shared.yamlerrors import describe_yaml_error

__all__ = [
    "DEFAULT_MANIFEST_PATH",
    "RUN_TOKEN",
    "check_run_id",
    "load_manifest_at_commit",
    "manifest_path_for",
    "parse_manifest",
    "substitute_run_token",
]

#: Where the manifest lives in the recorded commit unless told otherwise.
DEFAULT_MANIFEST_PATH = ".jobsup/k8s.yaml"
#: Replaced by the run id everywhere in the manifest text.
RUN_TOKEN = "{{JOBSUP_RUN}}"  # noqa: S105 - a placeholder, not a secret

_RUN_ID = re.compile(r"^[0-9a-f]{12}$")


def check_run_id(run_id: str) -> str:
    """Return ``run_id`` when it is a run id: 12 lowercase hex characters
    (README.md, "Commands"), which is also DNS-safe. Raises ManifestError otherwise."""
    if not isinstance(run_id, str) or not _RUN_ID.match(run_id):
        raise ManifestError(f"run id {run_id!r} is not 12 lowercase hex characters (e.g. 3f2a9c1e7b04)")
    return run_id


def manifest_path_for(task_manifest: str | None, kube_config: Mapping[str, Any]) -> str:
    """Which manifest a run uses: ``task_manifest`` (``--manifest PATH`` or the
    task YAML's ``kubernetes.manifest``), else the effective config's
    ``kubernetes.manifest`` (``kube_config`` is that section), else
    :data:`DEFAULT_MANIFEST_PATH`. Repository-relative."""
    if task_manifest:
        return task_manifest
    configured = kube_config.get("manifest")
    if isinstance(configured, str) and configured:
        return configured
    return DEFAULT_MANIFEST_PATH


def _check_manifest_path(path: str) -> str:
    """Normalise a repository-relative manifest path; raise ManifestError for
    an absolute path or one that leaves the repository."""
    rel = path.strip()
    if not rel:
        raise ManifestError("the manifest path is empty; give a repository-relative path such as .jobsup/k8s.yaml")
    if rel.startswith("/"):
        raise ManifestError(
            f"manifest path {path!r} is absolute; give it relative to the repository root, e.g. .jobsup/k8s.yaml"
        )
    norm = posixpath.normpath(rel)
    if norm == ".." or norm.startswith("../"):
        raise ManifestError(f"manifest path {path!r} leaves the repository; it must be inside it")
    return norm


def load_manifest_at_commit(repo: Path, commit: str, path: str) -> str:
    """The manifest text at repository-relative ``path`` in ``commit`` of ``repo``.

    Reads the committed blob (``git show COMMIT:PATH``), never the working
    tree. Raises ManifestError when ``path`` is absolute or leaves the
    repository, when the commit has no such file (the message says to
    commit it when the working tree of ``repo`` has it, else to write and
    commit it, and how to point at another path), or when it is not
    UTF-8. Raises SourceError when git itself fails.
    """
    rel = _check_manifest_path(path)
    data = read_file_at(repo, commit, rel)
    if data is None:
        if (repo / rel).is_file():
            raise ManifestError(
                f"Kubernetes manifest {rel!r} exists in the working tree but not in commit {commit[:12]}: "
                "commit it (jobsup reads the manifest from the recorded commit, never from the working tree)"
            )
        raise ManifestError(
            f"no Kubernetes manifest at {rel!r} in commit {commit[:12]}: write the manifest, "
            "commit it, and submit again (jobsup reads it from the recorded commit, never from the "
            "working tree). If it lives elsewhere, pass --manifest PATH (repository-relative) or set "
            "kubernetes.manifest in the task YAML."
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ManifestError(f"{rel} at commit {commit[:12]} is not UTF-8 text: {exc}") from None


def substitute_run_token(text: str, run_id: str) -> str:
    """Replace every ``{{JOBSUP_RUN}}`` in ``text`` with ``run_id`` (checked with
    :func:`check_run_id`). Plain text replacement, before any parsing."""
    return text.replace(RUN_TOKEN, check_run_id(run_id))


class _ManifestLoader(BoundedLoader):
    """Safe loader with the YAML caps: timestamps stay strings, duplicate
    mapping keys are errors."""

    yaml_implicit_resolvers = {  # noqa: RUF012 - PyYAML's own class attribute, replaced per class
        first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                continue  # the base class reports unhashable keys
            if key in seen:
                first = seen[key].start_mark.line + 1
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {key!r} (first given on line {first})",
                    key_node.start_mark,
                )
            seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


def parse_manifest(text: str, *, manifest_path: str = DEFAULT_MANIFEST_PATH) -> list[dict[str, Any]]:
    """Parse manifest text into its objects, in order.

    Accepts several YAML documents and ``kind: List`` documents (flattened
    into their ``items``, recursively, order kept); empty documents are
    skipped. Each returned object is a fresh dict the caller may change.

    Raises ManifestError naming ``manifest_path``, the document number
    (1-based) and the line for a YAML syntax error, a duplicate key, a
    document that expands through its aliases to more than
    :data:`~supervisord.shared.config.yamlload.MAX_YAML_NODES` values or has a
    recursive alias; naming ``manifest_path`` for text over
    :data:`~supervisord.shared.config.yamlload.MAX_YAML_BYTES` or nested too
    deeply to parse; naming
    the document for one that is not a mapping or a List without an
    ``items`` list; and saying so when there are no objects at all.
    """
    too_large = check_yaml_size(text)
    if too_large is not None:
        raise ManifestError(f"{manifest_path}: {too_large}")
    objects: list[dict[str, Any]] = []
    docs = yaml.load_all(text, Loader=_ManifestLoader)
    number = 0
    while True:
        number += 1
        try:
            doc = next(docs)
        except StopIteration:
            break
        except yaml.YAMLError as exc:
            raise ManifestError(f"{manifest_path}: {describe_yaml_error(exc, document=number)}") from None
        except RecursionError:
            raise ManifestError(f"{manifest_path}: document {number}: not valid YAML: nested too deeply") from None
        if doc is None:
            continue
        _flatten(doc, f"{manifest_path}: document {number}", objects)
    if not objects:
        raise ManifestError(f"{manifest_path} contains no Kubernetes objects; it needs at least one batch/v1 Job")
    return objects


def _flatten(doc: Any, where: str, out: list[dict[str, Any]]) -> None:
    if not isinstance(doc, dict):
        raise ManifestError(
            f"{where} is a {type(doc).__name__}, not a Kubernetes object (a mapping with apiVersion, kind, metadata)"
        )
    if doc.get("kind") == "List":
        items = doc.get("items")
        if items is None:
            return
        if not isinstance(items, list):
            raise ManifestError(f"{where}: kind List needs `items` to be a list of objects")
        for i, item in enumerate(items):
            _flatten(item, f"{where}, items[{i}]", out)
        return
    out.append(doc)
