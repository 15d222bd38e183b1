"""``jobsup submit`` does not import jsonschema (about 0.1 s of CPU per
call, bench/sweep_submit.py): the config schema's validator is made at its
first use (supervisord.shared.config.schema), and still refuses a bad value."""

from __future__ import annotations

import subprocess
import sys

from supervisord.shared.config.schema import validate_document


def test_the_submit_path_imports_no_jsonschema() -> None:
    code = (
        "import sys\n"
        "import supervisord.client.cli.runs_cmd, supervisord.client.cli.submit_request, supervisord.shared.config.dotlist\n"
        "print('jsonschema' in sys.modules)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "False"


def test_the_validator_still_refuses_a_bad_value() -> None:
    errors = validate_document({"timeout": [], "local": {"progress_interval_s": True}})
    assert len(errors) == 2 and errors[0].startswith("local.progress_interval_s") and "timeout" in errors[1]
