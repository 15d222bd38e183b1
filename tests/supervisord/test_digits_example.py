"""The digits example (examples/digits/train.py) writes its model to
``$JOBSUP_OUTPUT_DIR/model.pkl``; jobsup lists it and ``jobsup which``
finds the run that made it.

CI installs ``.[test]`` only: scikit-learn (with numpy and scipy, the
``example`` extra) is too heavy for it. So the first test runs the
example's own output and progress code (``save_model``, ``report``: they
import no scikit-learn) as a real local run, in CI; the second trains the
real model end to end and runs only where scikit-learn is installed
(``pip install -e '.[example]'``)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import pickle
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.supervisord.jobsup_env import JobsupEnv, make_repo

pytestmark = [pytest.mark.timeout(180), pytest.mark.daemon]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "digits"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository holding the example as committed here."""
    files = {f"examples/digits/{p.name}": p.read_text() for p in EXAMPLE.iterdir() if p.is_file()}
    return make_repo(tmp_path / "proj", files)


def _outputs(js: JobsupEnv, run_id: str, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        doc: dict[str, Any] = json.loads(js.cli("outputs", run_id, "-o", "json").stdout)
        if doc["state"] == "recorded":
            return doc
        assert time.monotonic() < deadline, doc
        time.sleep(0.2)


def _check_model_found(js: JobsupEnv, run_id: str, tmp_path: Path) -> Any:
    """The run's outputs are exactly model.pkl, in its outputs folder, and
    ``which`` names the run from a copy of it. Returns the unpickled model."""
    doc = _outputs(js, run_id)
    assert [f["path"] for f in doc["files"]] == ["model.pkl"]
    model = Path(doc["dir"]) / "model.pkl"
    assert model.parent.name == run_id
    assert doc["files"][0]["sha256"] == hashlib.sha256(model.read_bytes()).hexdigest()
    copy = tmp_path / "somewhere-else.pkl"
    shutil.copyfile(model, copy)
    found = json.loads(js.cli("which", str(copy), "-o", "json").stdout)["files"][0]["runs"]
    assert [m["run"] for m in found] == [run_id] and found[0]["path"] == "model.pkl"
    with model.open("rb") as f:
        return pickle.load(f)


def test_the_examples_output_and_progress_code_under_jobsup(
    js: JobsupEnv, repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = (
        "import sys; sys.path.insert(0, 'examples/digits'); import train; "
        "train.report(2, 2, {'test_acc': 0.97}); "
        "print(train.save_model({'model': 'stand-in', 'test_accuracy': 0.97}))"
    )
    run_id = js.cli("submit", "--name", "digits-io", "--", sys.executable, "-c", code, cwd=repo).stdout.strip()
    r = js.cli("wait", run_id, "--timeout", "120s", check=False)
    assert r.returncode == 0, js.cli("logs", run_id).stdout
    model = _check_model_found(js, run_id, tmp_path)
    assert model == {"model": "stand-in", "test_accuracy": 0.97}
    printed = js.cli("logs", run_id).stdout.strip()
    assert printed.endswith(f"/{run_id}/model.pkl")
    run = json.loads(js.cli("show", run_id, "-o", "json").stdout)
    assert run["progress"]["metrics"] == {"test_acc": 0.97}
    # Outside jobsup it writes nothing and says so.
    monkeypatch.delenv("JOBSUP_OUTPUT_DIR", raising=False)
    monkeypatch.syspath_prepend(str(EXAMPLE))
    import train

    assert train.save_model({}) is None


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("sklearn") is None, reason="needs scikit-learn (pip install -e '.[example]')"
)
def test_the_digits_example_end_to_end(js: JobsupEnv, repo: Path, tmp_path: Path) -> None:
    run_id = js.cli(
        "submit", "--name", "digits", "--", sys.executable, "examples/digits/train.py", "--epochs", "2", cwd=repo
    ).stdout.strip()
    r = js.cli("wait", run_id, "--timeout", "150s", check=False)
    assert r.returncode == 0, js.cli("logs", run_id).stdout
    model = _check_model_found(js, run_id, tmp_path)
    assert model["test_accuracy"] >= 0.8
    assert "model written to" in js.cli("logs", run_id).stdout
