"""One wording each: the summary of several config errors, a YAML error,
and one reader of a kubeconfig's current-context (each used to be written
out in several modules)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from supervisord.shared.exceptions import ConfigError, PreflightConfigError
from supervisord.shared.kubeconfig import current_context
from supervisord.shared.yamlerrors import describe_yaml_error

ROOT = Path(__file__).resolve().parents[2]


def _product_sources() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for p in (ROOT / "supervisord").rglob("*.py")}


def test_config_error_of_one_or_several() -> None:
    one = ConfigError.of(["a: bad"])
    assert str(one) == "a: bad" and one.errors == ["a: bad"]
    two = ConfigError.of(["a: bad", "b: worse"], "hook config errors")
    assert str(two) == "2 hook config errors:\n  - a: bad\n  - b: worse" and two.errors == ["a: bad", "b: worse"]
    assert type(PreflightConfigError.of(["x"])) is PreflightConfigError


def test_describe_yaml_error() -> None:
    with pytest.raises(yaml.YAMLError) as err:
        yaml.safe_load("a: [1, 2\nb: 3\n")
    text = describe_yaml_error(err.value)
    assert re.match(r"line \d+, column \d+: not valid YAML: while parsing a flow sequence: ", text), text
    assert describe_yaml_error(err.value, document=2).startswith("document 2, line ")
    assert describe_yaml_error(yaml.YAMLError("odd")) == "not valid YAML: odd"


def test_current_context(tmp_path: Path) -> None:
    a, b, broken = tmp_path / "a", tmp_path / "b", tmp_path / "broken"
    a.write_text("apiVersion: v1\nkind: Config\n")
    b.write_text("current-context: two\n")
    broken.write_text("current-context: [\n")
    assert current_context([tmp_path / "missing", a, b]) == "two"
    assert current_context([a]) is None
    with pytest.raises(ConfigError, match=rf"^{broken}: kubeconfig: line 2, column 1: not valid YAML: "):
        current_context([broken, b])


def test_no_other_module_writes_these_out_again() -> None:
    found = []
    for path, text in _product_sources().items():
        if re.search(r'errors\)\} [\w -]*(errors|conflicts):\\n"', text) and path != "supervisord/shared/exceptions.py":
            found.append(f"{path}: an 'N errors:' summary (use ConfigError.of)")
        if "problem_mark" in text and path != "supervisord/shared/yamlerrors.py":
            found.append(f"{path}: a YAML error's mark (use describe_yaml_error)")
        if re.search(r"""["']current-context["']\)""", text) and path != "supervisord/shared/kubeconfig.py":
            found.append(f"{path}: a kubeconfig's current-context (use supervisord.shared.kubeconfig)")
    assert not found, found
