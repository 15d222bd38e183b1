"""Query parameters read one way by the socket API and the web page."""

from __future__ import annotations

import pytest

from supervisord.daemon.api.query import INT_MAX, flag_param, float_param, int_param
from supervisord.shared.exceptions import UsageError


def test_values_and_defaults() -> None:
    params = {"a": "7", "empty": "", "f": "TRUE", "g": "0", "t": "1.5"}
    assert int_param(params, "a") == 7
    assert int_param(params, "missing", 3) == 3
    assert int_param(params, "empty", 4) == 4
    assert int_param({"a": str(INT_MAX)}, "a") == INT_MAX
    assert (flag_param(params, "f"), flag_param(params, "g"), flag_param(params, "missing")) == (True, False, False)
    assert float_param(params, "t") == 1.5
    assert float_param(params, "missing") is None


@pytest.mark.parametrize(
    ("call", "text"),
    [
        (lambda: int_param({"limit": "x"}, "limit"), "query parameter limit='x' must be an integer"),
        (lambda: int_param({"limit": "0"}, "limit", minimum=1), "query parameter limit='0' must be in 1.."),
        (
            lambda: int_param({"after": str(2**63)}, "after"),
            "query parameter after='9223372036854775808' must be in 0..",
        ),
        (lambda: int_param({"n": "1001"}, "n", maximum=1000), "query parameter n='1001' must be in 0..1000"),
        (lambda: int_param({"n": "9" * 100}, "n"), "query parameter n='" + "9" * 40 + "' must be in"),
        (lambda: float_param({"timeout": "nan"}, "timeout"), "query parameter timeout='nan' must be a finite number"),
        (lambda: float_param({"timeout": "-1"}, "timeout"), "query parameter timeout='-1' must be a finite number"),
        (lambda: float_param({"timeout": "soon"}, "timeout"), "query parameter timeout='soon' must be a number"),
    ],
)
def test_bad_values_are_usage_errors_naming_the_parameter(call: object, text: str) -> None:
    with pytest.raises(UsageError) as err:
        call()  # type: ignore[operator]
    assert text in str(err.value)
