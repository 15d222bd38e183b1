"""The one run-reference rule (supervisord.shared.runref) the daemon and the CLI share."""

from __future__ import annotations

import re

import pytest

from supervisord.shared.exceptions import UsageError
from supervisord.shared.runref import RUN_REF_HINT, check_run_ref, check_run_refs


@pytest.mark.parametrize(("ref", "norm"), [("abcd", "abcd"), (" ABCDEF012345 ", "abcdef012345"), ("0000", "0000")])
def test_accepts_4_to_12_hex_any_case(ref: str, norm: str) -> None:
    assert check_run_ref(ref) == norm


@pytest.mark.parametrize("ref", ["", "abc", "zzzz", "abcd-", "abcdef0123456", "g123"])
def test_rejects_anything_else_with_the_hint(ref: str) -> None:
    with pytest.raises(UsageError, match=re.escape(RUN_REF_HINT)):
        check_run_ref(ref)


def test_several_refs_name_every_bad_one_and_say_nothing_was_done() -> None:
    with pytest.raises(UsageError) as err:
        check_run_refs(["abcd", "xy", "zzzz"])
    assert str(err.value) == (f"run id 'xy': {RUN_REF_HINT}; run id 'zzzz': {RUN_REF_HINT}; nothing was done")
    check_run_refs(["abcd", "ABCDEF012345"])


#: Strings around the rule's edges. Not a trailing newline: JSON Schema's
#: ``$`` (ECMA-262) refuses it, Python's ``re`` (which jsonschema uses) does
#: not; the daemon strips blanks anyway (:func:`normalize_run_ref`).
EDGES = ["", "abc", "abcd", "0123456789ab", "0123456789abc", "zzzz", "abcg", "abc-", "ABCD", "ab cd", "éabc"]


def test_the_mcp_tools_run_ref_schema_is_the_rule() -> None:
    """Every run reference of the MCP tools' input schemas carries the
    rule (4 to 12 lowercase hex), says so, and accepts exactly what
    :func:`is_run_ref` accepts."""
    import jsonschema

    from supervisord.client.mcp.server import TOOLS, _input_problem
    from supervisord.shared.runref import MIN_PREFIX, RUN_ID_LENGTH, is_run_ref

    refs: list[tuple[str, str, dict[str, object]]] = []
    for tool in TOOLS:
        for name, prop in tool.input_schema["properties"].items():
            schema = prop.get("items", prop) if prop.get("type") == "array" else prop
            # Where a sweep id is accepted too (wait, cancel): its run-id branch.
            schema = schema["anyOf"][0] if "anyOf" in schema else schema
            if name in ("run", "runs", "after", "after_any"):
                refs.append((tool.name, name, schema))
    assert {(t, n) for t, n, _ in refs} >= {("show", "run"), ("logs", "run"), ("wait", "runs"), ("cancel", "runs")}
    for tool_name, name, schema in refs:
        assert schema["minLength"] == MIN_PREFIX and schema["maxLength"] == RUN_ID_LENGTH, (tool_name, name)
        assert "4 to 12 lowercase hex" in str(schema["description"]), (tool_name, name, schema)
        validator = jsonschema.Draft202012Validator(schema)
        for ref in EDGES:
            assert validator.is_valid(ref) == is_run_ref(ref), (tool_name, name, ref)
    problem = _input_problem("show", {"run": "zzzz"})
    assert problem is not None and problem.startswith("run: 'zzzz' is not a run id") and "4 to 12" in problem
    assert _input_problem("cancel", {"runs": ["abcd", "abcdef0123456"]}) is not None
    assert _input_problem("show", {"run": "0123456789ab"}) is None
