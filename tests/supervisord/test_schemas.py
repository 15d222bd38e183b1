"""The published JSON Schemas (``jobsup schema``) against REAL output: the real
daemon, the real CLI with ``-o json``, real local runs and runs on the
simulated Kubernetes cluster. A change to an output shape without its schema
fails here."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from supervisord.shared import schemas
from supervisord.shared.events import CATALOG
from tests.supervisord.jobsup_env import JobsupEnv, jobsup_env, make_repo

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parents[2]


def check(name: str, instance: Any) -> None:
    problems = schemas.schema_errors(name, instance)
    assert not problems, f"{name}: {problems}\n{json.dumps(instance, indent=2)[:3000]}"


def ndjson(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_every_schema_is_valid_2020_12_and_self_contained() -> None:
    assert {
        "run",
        "runs",
        "run-detail",
        "event",
        "log-line",
        "wait",
        "queue",
        "doctor",
        "config",
        "config-origin",
    } <= set(schemas.names())
    for name in schemas.names():
        doc = schemas.load(name)
        assert doc["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        jsonschema.Draft202012Validator.check_schema(doc)
        # Self-contained: every $ref points inside the document.
        refs = re.findall(r'"\$ref": "([^"]*)"', json.dumps(doc))
        assert all(r.startswith("#") for r in refs), (name, refs)
        schemas.validator(name)  # compiles and resolves


def test_every_recorded_event_type_has_a_schema() -> None:
    """Static: each cataloged event type (the code makes events only through
    supervisord.shared.events: test_event_catalog.py) and each type the store pins
    has ``events/T.json``."""
    found = set(CATALOG)
    types_py = (ROOT / "store" / "types.py").read_text()
    found.update(re.findall(r'^[A-Z_]+: Final = "([A-Z][A-Za-z]+)"$', types_py, re.MULTILINE))
    assert {"Submitted", "PhaseChanged", "LogLines", "ObjectCreated"} <= found
    missing = found - set(schemas.event_types())
    assert not missing, f"event types with no schema in supervisord/shared/schemas/events/: {sorted(missing)}"


def test_unknown_event_type_and_extra_run_field_are_refused() -> None:
    ev = {
        "seq": 1,
        "run_id": "0123456789ab",
        "version": 1,
        "type": "NoSuchEvent",
        "at": "2026-01-01T00:00:00Z",
        "data": {},
    }
    assert schemas.schema_errors("event", ev)
    ev["type"], ev["data"] = "PhaseChanged", {"phase": "RUNNING", "reason": None, "message": None}
    assert not schemas.schema_errors("event", ev)
    ev["data"] = {"phase": "SLEEPING"}
    assert schemas.schema_errors("event", ev)


def test_schema_command(tmp_path: Path) -> None:
    with jobsup_env(tmp_path) as env:  # no daemon needed
        listed = env.cli("schema").stdout.splitlines()
        assert [line.split("\t")[0] for line in listed] == schemas.names()
        for name in ("run", "event", "config"):
            assert json.loads(env.cli("schema", name).stdout) == schemas.load(name)
        bad = env.cli("schema", "nope", check=False)
        assert bad.returncode == 2 and "nope" in bad.stderr and "run-detail" in bad.stderr and bad.stdout == ""


@pytest.fixture(scope="module")
def js(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JobsupEnv]:
    """One daemon for the whole module (starting one per test costs more than the tests)."""
    with jobsup_env(tmp_path_factory.mktemp("schemas"), daemon=True) as env:
        yield env


def test_local_outputs_match_their_schemas(js: JobsupEnv) -> None:
    repo = make_repo(
        js.root / "proj",
        {
            "ok.sh": "echo out\necho err >&2\n",
            "fail.sh": "echo boom\nexit 7\n",
            "sleep.sh": "echo zz\nsleep 60\n",
            ".jobsup.yaml": "project: schemas\nenv:\n  API_TOKEN: hunter2\n",
        },
    )
    ok = js.submit(repo, "--env", "SECRET=x", "--", "sh", "ok.sh")
    fail = js.submit(repo, "--name", "fail", "--", "sh", "fail.sh")
    slow = js.submit(repo, "--name", "slow", "--", "sh", "sleep.sh")
    assert js.cli("wait", slow, "--for", "RUNNING", "--timeout", "60s", check=False).returncode == 0
    # A run in flight, then canceled.
    check("run-detail", js.show(slow))
    check("runs", json.loads(js.cli("cancel", slow, "-o", "json").stdout))

    waited = js.cli("wait", ok, fail, "-o", "json", "--timeout", "60s", check=False)
    assert waited.returncode == 1
    check("runs", json.loads(waited.stdout))
    for rid in (ok, fail, slow):
        check("run-detail", js.show(rid))
        for line in ndjson(js.cli("logs", rid, "-o", "json").stdout):
            check("log-line", line)
    listed = json.loads(js.cli("runs", "--all", "-o", "json").stdout)
    assert {ok, fail, slow} <= {r["id"] for r in listed}
    check("runs", listed)
    for r in listed:
        check("run", r)

    events = ndjson(js.cli("events", "-o", "json").stdout)
    types = {e["type"] for e in events}
    assert {"Submitted", "HandleRecorded", "PhaseChanged", "LogLines", "CancelRequested"} <= types
    for ev in events:
        check("event", ev)

    doctor = js.cli("doctor", "-o", "json", check=False)
    check("doctor", json.loads(doctor.stdout))

    check("config", json.loads(js.cli("config", "show", "-o", "json", cwd=repo).stdout))
    check("config-origin", json.loads(js.cli("config", "show", "--origin", "-o", "json", cwd=repo).stdout))


def test_scheduler_and_hook_outputs_match_their_schemas(js: JobsupEnv) -> None:
    """Queued, held, released and hooked runs: `queue`, `hold`/`release`,
    `show` (with its on_done and hooks) and the events they record."""
    # `first` runs until the test lets it go (a fixed sleep let it end, and
    # `held` with it, before `hold` on a loaded machine).
    go = js.root / "go"
    nap = f"for i in $(seq 1200); do [ -e {go} ] && break; sleep 0.1; done\necho ok\n"
    repo = make_repo(js.root / "sched", {"nap.sh": nap, "ok.sh": "echo ok\n", "hook.sh": "echo hooked\nexit 3\n"})
    first = js.submit(repo, "--name", "first", "--", "sh", "nap.sh")
    held = js.submit(
        repo,
        "--name",
        "held",
        "--queue",
        "batch",
        "--priority",
        "7",
        "--after-any",
        first,
        "--on-done",
        "sh hook.sh",
        "--",
        "sh",
        "ok.sh",
    )
    check("runs", json.loads(js.cli("hold", held, "-o", "json").stdout))
    queue = json.loads(js.cli("queue", "-o", "json").stdout)
    check("queue", queue)
    assert any(w["id"] == held and w["held"] and w["queue"] == "batch" for w in queue["waiting"]), queue
    go.touch()
    check("runs", json.loads(js.cli("release", held, "-o", "json").stdout))
    assert js.cli("wait", held, "--timeout", "60s", check=False).returncode == 0
    # The on-done hook (exit 3) is recorded after the terminal phase.
    for _ in range(100):
        detail = js.show(held)
        if detail.get("hooks"):
            break
        time.sleep(0.2)
    check("run-detail", detail)
    assert detail["on_done"] == ["sh", "hook.sh"] and detail["hooks"][0]["type"] == "HookFailed", detail
    check("queue", json.loads(js.cli("queue", "-o", "json").stdout))
    events = ndjson(js.cli("events", held, "-o", "json").stdout)
    assert {"Submitted", "Held", "HoldReleased", "Admitted", "HookFailed"} <= {e["type"] for e in events}, events
    for ev in events:
        check("event", ev)


def test_kubernetes_outputs_match_their_schemas(tmp_path: Path) -> None:
    from tests.supervisord.backends.kubernetes.k8s_backend_helpers import (
        MANIFEST_PATH,
        job_manifest,
        sim_cluster,
        use_sim,
    )

    with sim_cluster(tmp_path / "sim") as sim, jobsup_env(tmp_path / "js") as env:
        use_sim(env, sim, pod_ready_timeout_s=20)
        env.start_daemon()
        repo = make_repo(tmp_path / "proj", {MANIFEST_PATH: job_manifest(), "hello.sh": "echo hello\n"})
        done = env.submit(repo, "--backend", "kubernetes", "--env", "TOKEN=s3cr3t", "--", "sh hello.sh")
        slow = env.submit(repo, "--backend", "kubernetes", "--name", "slow", "--", "echo started; sleep 300")
        assert env.cli("wait", done, "--timeout", "2m", check=False).returncode == 0
        assert env.cli("wait", slow, "--for", "RUNNING", "--timeout", "60s", check=False).returncode == 0
        check("runs", json.loads(env.cli("cancel", slow, "-o", "json").stdout))
        for rid in (done, slow):
            check("run-detail", env.show(rid))
        events = ndjson(env.cli("events", "-o", "json").stdout)
        assert {"ObjectCreated", "StagingStep", "CancelRequested"} <= {e["type"] for e in events}
        for ev in events:
            check("event", ev)
        check("doctor", json.loads(env.cli("doctor", "-o", "json", check=False).stdout))
        render = env.cli("render", "--run-id", "0123456789ab", "-o", "json", "--", "sh hello.sh", cwd=repo)
        assert json.loads(render.stdout)["kind"] == "List"
