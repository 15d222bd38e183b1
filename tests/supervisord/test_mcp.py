"""``jobsup mcp`` end to end: the MCP SDK's own stdio client drives a real
``jobsup mcp`` process, which talks to a real daemon running real local jobs.

Every structured tool result is checked twice: by the SDK client against the
tool's declared output schema (``ClientSession.call_tool`` does it), and here
against the published schemas of :mod:`supervisord.shared.schemas`.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from supervisord.shared import schemas
from tests.supervisord.jobsup_env import JobsupEnv, jobsup_env, make_repo

pytestmark = [pytest.mark.timeout(240), pytest.mark.anyio]


@pytest.fixture(scope="module")
def js(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JobsupEnv]:
    """One daemon for the whole module (starting one per test costs more than the tests)."""
    with jobsup_env(tmp_path_factory.mktemp("mcp"), daemon=True) as env:
        yield env


@pytest.fixture(scope="module")
def repo(js: JobsupEnv) -> Path:
    return make_repo(
        js.root / "proj",
        {
            "ok.sh": "for i in $(seq 1 50); do echo line-$i; done\n",
            "fail.sh": "echo starting\necho 'Traceback (most recent call last):' >&2\n"
            "echo 'ValueError: bad learning rate' >&2\nexit 3\n",
            "sleep.sh": "echo sleeping\nsleep 60\n",
            "task.yaml": "name: from-file\nrun: sh ok.sh\n",
        },
    )


@asynccontextmanager
async def mcp(js: JobsupEnv, cwd: Path) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(command=sys.executable, args=["-m", "supervisord", "mcp"], env=js.env, cwd=str(cwd))
    with (js.root / "mcp-stderr.log").open("a") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            yield session


async def call(session: ClientSession, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    """A successful call's structured content (the SDK validated it against
    the tool's output schema)."""
    result = await session.call_tool(tool, args)
    assert isinstance(result, types.CallToolResult)
    assert not result.is_error, result.content
    out = result.structured_content
    assert isinstance(out, dict)
    assert json.loads(result.content[0].text) == out  # type: ignore[union-attr]
    return out


async def call_error(session: ClientSession, tool: str, args: dict[str, Any]) -> str:
    result = await session.call_tool(tool, args)
    assert isinstance(result, types.CallToolResult)
    assert result.is_error, result.structured_content
    text = result.content[0].text  # type: ignore[union-attr]
    assert "\n" not in text.strip(), text
    return str(text)


#: Events the daemon appends on its own after a run ended (its outputs list,
#: its last usage sample, its last progress report): a run that ended in an
#: earlier test may add one at any moment, so they are not counted.
_AFTERMATH = frozenset({"OutputsRecorded", "ResourceUsage", "Progress", "HookDelivered", "HookFailed"})


def _events_count(js: JobsupEnv) -> int:
    """The events a request could have recorded (see :data:`_AFTERMATH`)."""
    lines = js.cli("events", "-o", "json").stdout.splitlines()
    return sum(1 for line in lines if json.loads(line)["type"] not in _AFTERMATH)


async def test_tools_listed_with_schemas(js: JobsupEnv, repo: Path) -> None:
    async with mcp(js, repo) as s:
        listed = await s.list_tools()
    names = {t.name for t in listed.tools}
    assert names == {
        "submit",
        "render",
        "runs",
        "show",
        "logs",
        "wait",
        "cancel",
        "events",
        "queue",
        "top",
        "doctor",
        "triage",
        "sweep",
        "hold",
        "release",
        "pause",
        "resume",
        "update",
        "rerun",
        "outputs",
        "which",
    }
    import jsonschema

    for tool in listed.tools:
        assert tool.input_schema["type"] == "object"
        assert tool.output_schema is not None and tool.output_schema.get("type") == "object", tool.name
        jsonschema.Draft202012Validator.check_schema(tool.input_schema)
        jsonschema.Draft202012Validator.check_schema(tool.output_schema)


async def test_submit_wait_logs_show_events(js: JobsupEnv, repo: Path) -> None:
    async with mcp(js, repo) as s:
        sub = await call(s, "submit", {"command": ["sh", "ok.sh"], "name": "mcp-ok"})
        run = sub["run"]
        schemas.validate("run", run)
        assert run["name"] == "mcp-ok"
        # Wait with the run's cursor: race-free, returns the new cursor.
        out = await call(
            s, "wait", {"runs": [run["id"]], "for": "terminal", "timeout_s": 60, "after_seq": run["last_seq"]}
        )
        schemas.validate("wait", out)
        assert out["outcome"] == "met" and out["exit_code"] == 0
        assert out["runs"][0]["phase"] == "COMPLETED"
        assert out["after_seq"] >= out["runs"][0]["last_seq"]
        # A change wait from the new cursor: nothing new, so it times out.
        again = await call(
            s, "wait", {"runs": [run["id"]], "for": "change", "timeout_s": 0.5, "after_seq": out["after_seq"]}
        )
        assert again["outcome"] == "timeout" and again["exit_code"] == 124
        # ...but from the submit's cursor, the phase changes already happened.
        early = await call(
            s, "wait", {"runs": [run["id"][:6]], "for": "change", "timeout_s": 5, "after_seq": run["last_seq"]}
        )
        assert early["outcome"] == "met"

        # Logs with a byte cap: 50 lines of 8-9 bytes, capped at 100 bytes.
        logs = await call(s, "logs", {"run": run["id"], "max_bytes": 100})
        assert logs["truncated"] is True and logs["total_lines"] == 50
        assert sum(len(line["text"]) + 1 for line in logs["lines"]) <= 100
        assert [x["text"] for x in logs["lines"]][:2] == ["line-1", "line-2"]
        nxt = logs["next_line"]
        assert nxt == logs["lines"][-1]["line_no"] + 1
        rest = await call(s, "logs", {"run": run["id"], "from_line": nxt, "to_line": 50})
        assert rest["truncated"] is False and rest["next_line"] is None
        assert [x["line_no"] for x in logs["lines"] + rest["lines"]] == list(range(1, 51))
        # A cap smaller than one line: that line's head, and the reader moves on.
        tiny = await call(s, "logs", {"run": run["id"], "max_bytes": 4})
        assert tiny["truncated"] is True and (tiny["next_line"], tiny["next_byte"]) == (1, 3)
        assert [x["line_no"] for x in tiny["lines"]] == [1] and tiny["lines"][0]["text"] == "lin"
        more = await call(s, "logs", {"run": run["id"], "max_bytes": 4, "from_line": 1, "from_byte": 3})
        assert more["lines"][0]["text"] == "e-1" and (more["next_line"], more["next_byte"]) == (2, None)
        tail = await call(s, "logs", {"run": run["id"], "tail": 3})
        assert [x["text"] for x in tail["lines"]] == ["line-48", "line-49", "line-50"]
        for page in (logs, rest, tail):
            for line in page["lines"]:
                schemas.validate("log-line", line)

        shown = await call(s, "show", {"run": run["id"]})
        schemas.validate("run-detail", shown)
        assert shown["command"] == "sh ok.sh"
        # The same object `jobsup show -o json` prints.
        cli_show = js.show(run["id"])
        assert {k: v for k, v in shown.items() if k != "updated_at"} == {
            k: v for k, v in cli_show.items() if k != "updated_at"
        }

        page = await call(s, "events", {"run": run["id"], "limit": 3})
        assert len(page["events"]) == 3 and page["more"] is True
        page2 = await call(s, "events", {"run": run["id"], "after_seq": page["last_seq"], "limit": 1000})
        assert page2["more"] is False
        evs = page["events"] + page2["events"]
        assert [e["version"] for e in evs] == list(range(1, len(evs) + 1))
        for ev in evs:
            schemas.validate("event", ev)

        listed = await call(s, "runs", {"all": True})
        schemas.validate("runs", listed["runs"])
        assert run["id"] in {r["id"] for r in listed["runs"]}

        doc = await call(s, "doctor", {})
        schemas.validate("doctor", doc["checks"])
        assert doc["checks"][0]["name"] == "daemon" and doc["checks"][0]["ok"] is True

        from_file = await call(s, "submit", {"task_file": "task.yaml"})
        assert from_file["run"]["name"] == "from-file"
        await call(s, "wait", {"runs": [from_file["run"]["id"]], "timeout_s": 60})


async def test_logs_cursor_goes_through_lines_longer_than_the_cap(js: JobsupEnv, repo: Path) -> None:
    """W14: a line longer than max_bytes came back cut and next_line pointed
    past it; following the cursor now gives every byte, piece by piece, each
    answer within the cap and cut on a character boundary."""
    script = "print('ab\\u00e9\\u20ac' * 300); print('short'); print('\\U0001f600' * 40)"
    expected = ["ab\u00e9\u20ac" * 300, "short", "\U0001f600" * 40]
    async with mcp(js, repo) as s:
        run = (await call(s, "submit", {"command": [sys.executable, "-c", script], "name": "mcp-long"}))["run"]
        await call(s, "wait", {"runs": [run["id"]], "timeout_s": 60, "after_seq": run["last_seq"]})
        got: dict[int, str] = {}
        cursor: tuple[int | None, int | None] = (1, None)
        for _ in range(200):
            line, byte = cursor
            if line is None:
                break
            args: dict[str, Any] = {"run": run["id"], "max_bytes": 37, "from_line": line}
            if byte is not None:
                args["from_byte"] = byte
            page = await call(s, "logs", args)
            assert page["lines"], page
            assert sum(len(x["text"].encode()) for x in page["lines"]) <= 37, page
            for x in page["lines"]:
                got[x["line_no"]] = got.get(x["line_no"], "") + x["text"]
            cursor = (page["next_line"], page["next_byte"])
    assert [got[i] for i in sorted(got)] == expected


async def test_triage_failing_run(js: JobsupEnv, repo: Path) -> None:
    async with mcp(js, repo) as s:
        run = (await call(s, "submit", {"command": "sh fail.sh", "name": "mcp-fail"}))["run"]
        out = await call(s, "wait", {"runs": [run["id"]], "timeout_s": 60, "after_seq": run["last_seq"]})
        assert out["exit_code"] == 1 and out["runs"][0]["phase"] == "ERROR"
        tri = await call(s, "triage", {"run": run["id"]})
    assert tri["phase"] == "ERROR" and tri["reason"] == "NonZeroExit" and tri["exit_code"] == 3
    texts = [x["text"] for x in tri["error_lines"]]
    assert "ValueError: bad learning rate" in texts and "Traceback (most recent call last):" in texts
    assert "starting" not in texts
    assert tri["pending_reason"] is None
    assert "exited non-zero" in tri["suggestion"]
    schemas.validate("run", tri["run"])


async def test_cancel_and_cancelled_wait_returns_promptly(js: JobsupEnv, repo: Path) -> None:
    async with mcp(js, repo) as s:
        run = (await call(s, "submit", {"command": "sh sleep.sh", "name": "mcp-sleep"}))["run"]
        await call(s, "wait", {"runs": [run["id"]], "for": "RUNNING", "timeout_s": 60})

        # A long wait the client gives up on: the call ends at once, and the
        # server keeps serving.
        started = time.monotonic()
        with anyio.move_on_after(1.0) as scope:
            await s.call_tool("wait", {"runs": [run["id"]], "timeout_s": 600})
        assert scope.cancelled_caught
        with anyio.fail_after(10):
            shown = await call(s, "show", {"run": run["id"]})
        assert time.monotonic() - started < 10
        assert shown["phase"] == "RUNNING"

        done = await call(s, "cancel", {"runs": [run["id"]]})
        assert done["runs"][0]["phase"] == "CANCELED"
        schemas.validate("runs", done["runs"])
        out = await call(s, "wait", {"runs": [run["id"]], "timeout_s": 10})
        assert out["exit_code"] == 3


async def test_wait_never_blocks_past_its_timeout(js: JobsupEnv, repo: Path) -> None:
    async with mcp(js, repo) as s:
        run = (await call(s, "submit", {"command": "sh sleep.sh", "name": "mcp-sleep2"}))["run"]
        try:
            started = time.monotonic()
            out = await call(s, "wait", {"runs": [run["id"]], "timeout_s": 2.5, "after_seq": run["last_seq"]})
            took = time.monotonic() - started
            assert out["outcome"] == "timeout" and out["exit_code"] == 124
            assert 2.4 <= took < 30, took  # generous upper bound: a loaded machine
            assert out["after_seq"] >= run["last_seq"]
        finally:
            await call(s, "cancel", {"runs": [run["id"]]})


async def test_bad_input_is_a_tool_error_naming_the_field_and_records_nothing(js: JobsupEnv, repo: Path) -> None:
    async with mcp(js, repo) as s:
        before = _events_count(js)
        assert (await call_error(s, "show", {"run": "ffffffffffff"})).startswith("run: ")
        assert (await call_error(s, "triage", {"run": "ffff"})).startswith("run: ")
        assert (await call_error(s, "logs", {"run": "ffffffffffff", "tail": 3})).startswith("run: ")
        assert (await call_error(s, "cancel", {"runs": ["ffffffffffff"]})).startswith("runs[0]: ")
        assert (await call_error(s, "wait", {"runs": ["ffffffffffff"], "timeout_s": 1})).startswith("runs: ")
        msg = await call_error(s, "wait", {"runs": ["ffffffffffff"], "timeout_s": -1})
        assert msg.startswith("timeout_s: "), msg
        msg = await call_error(s, "wait", {"runs": ["ffffffffffff"], "timeout_s": "soon"})
        assert msg.startswith("timeout_s: "), msg
        msg = await call_error(s, "wait", {"runs": ["ffffffffffff"], "timeout_s": 10**6})
        assert msg.startswith("timeout_s: "), msg
        assert (await call_error(s, "wait", {"timeout_s": 1})).startswith("runs: ")
        assert (await call_error(s, "logs", {"run": "ffffffffffff", "bogus": 1})).startswith("bogus: ")
        msg = await call_error(s, "submit", {"command": "true", "timeout": "soon"})
        assert msg.startswith("timeout"), msg
        msg = await call_error(s, "submit", {"command": "true", "backend": "lsf"})
        assert msg.startswith("backend: "), msg
        msg = await call_error(s, "submit", {"command": "true", "env": {"TOKEN": 123456789}})
        assert msg.startswith("env.TOKEN: ") and "123456789" not in msg, msg
        msg = await call_error(s, "submit", {"name": "no-command"})
        assert msg.startswith("command: "), msg
        msg = await call_error(s, "submit", {"task_file": "missing.yaml"})
        assert "missing.yaml" in msg
        assert (await call_error(s, "nosuchtool", {})).startswith("tool: ")
        assert _events_count(js) == before


async def test_outputs_and_which_with_the_servers_environment(js: JobsupEnv, repo: Path) -> None:
    # The MCP server's submit starts the run from the server's own environment.
    params_env = {**js.env, "MCP_SIDE": "from-the-server"}
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "supervisord", "mcp"], env=params_env, cwd=str(repo)
    )
    with (js.root / "mcp-stderr.log").open("a") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            script = 'echo "$MCP_SIDE" > "$JOBSUP_OUTPUT_DIR/side.txt"'
            run = (await call(s, "submit", {"command": ["bash", "-c", script], "name": "mcp-outputs"}))["run"]
            await call(s, "wait", {"runs": [run["id"]], "for": "terminal", "timeout_s": 60})
            deadline = time.monotonic() + 60
            out = await call(s, "outputs", {"run": run["id"]})
            while out["state"] != "recorded" and time.monotonic() < deadline:
                await anyio.sleep(0.1)
                out = await call(s, "outputs", {"run": run["id"]})
            schemas.validate("outputs", out)
            assert [f["path"] for f in out["files"]] == ["side.txt"]
            side = Path(out["dir"]) / "side.txt"
            assert side.read_text() == "from-the-server\n"
            found = await call(s, "which", {"files": [str(side), "0" * 64]})
            schemas.validate("which", found)
            assert [m["run"] for m in found["files"][0]["runs"]] == [run["id"]]
            assert found["files"][1]["runs"] == []
            assert (await call_error(s, "which", {"files": [str(js.root / "nope")]})).startswith("files: ")


async def test_queue_and_render(js: JobsupEnv, repo: Path) -> None:
    async with mcp(js, repo) as s:
        out = await call(s, "queue", {})
        schemas.validate("queue", out)
        cli = json.loads(js.cli("queue", "-o", "json").stdout)
        schemas.validate("queue", cli)
        assert set(out) == set(cli) == {"waiting", "gpus", "queues", "reservation", "notes"}
        top = await call(s, "top", {})
        schemas.validate("top", top)
        assert top["runs"] == [] and top["interval_s"] == 5
        # No manifest in this repository: a tool error naming it.
        msg = await call_error(s, "render", {"command": "python train.py"})
        assert "k8s.yaml" in msg
        # One with a manifest, given as `cwd`: the objects, as `render -o json` prints them.
        from tests.supervisord.backends.kubernetes.k8s_backend_helpers import (
            MANIFEST_PATH,
            job_manifest,
        )

        k8s_repo = make_repo(js.root / "k8s-proj", {MANIFEST_PATH: job_manifest(), "train.py": "print(1)\n"})
        out = await call(
            s, "render", {"command": ["python", "train.py"], "cwd": str(k8s_repo), "run_id": "0123456789ab"}
        )
        cli = js.cli("render", "--run-id", "0123456789ab", "-o", "json", "--", "python", "train.py", cwd=k8s_repo)
        assert out["objects"] == json.loads(cli.stdout)["items"]
        assert any(o["kind"] == "Job" for o in out["objects"])
        # backend slurm: the sbatch command and wrapper, as `render --backend slurm -o json`.
        args = {"command": "python train.py", "run_id": "0123456789ab", "gpus": 1, "memory": "2G", "cpus": 3}
        out = await call(s, "render", {**args, "backend": "slurm"})
        cli = js.cli(
            "render",
            "--backend",
            "slurm",
            "--run-id",
            "0123456789ab",
            "--gpus",
            "1",
            "--memory",
            "2G",
            "--cpus",
            "3",
            "-o",
            "json",
            "--",
            "python train.py",
            cwd=repo,
        )
        assert out["slurm"] == json.loads(cli.stdout) and out["objects"] == []
        assert {"--gpus=1", "--mem=2048M", "--cpus-per-task=3"} <= set(out["slurm"]["sbatch"])
        assert (await call_error(s, "render", {**args, "cwd": str(k8s_repo)})).startswith("gpus: ")


async def test_scheduling_options_reach_the_scheduler(js: JobsupEnv, repo: Path) -> None:
    """The scheduling options go through the CLI's submit request: `hold`
    gives a QUEUED run with reason Held, the others are recorded in its
    Submitted `scheduling`; the queue tool shows it; bad values are refused
    with nothing recorded."""
    async with mcp(js, repo) as s:
        dep = await call(s, "submit", {"command": "sh ok.sh", "name": "sched-dep", "force": True})
        dep_id = dep["run"]["id"]
        out = await call(
            s,
            "submit",
            {
                "command": "true",
                "name": "sched-held",
                "queue": "gpu",
                "priority": 5,
                "gpus": 0,
                "after_any": [dep_id[:6]],
                "hold": True,
            },
        )
        run_id = out["run"]["id"]
        deadline = time.monotonic() + 30
        while True:
            run = await call(s, "show", {"run": run_id})
            if run["reason"] == "Held" or time.monotonic() > deadline:
                break
            await anyio.sleep(0.2)
        assert (run["phase"], run["reason"]) == ("QUEUED", "Held"), run
        events = (await call(s, "events", {"run": run_id}))["events"]
        submitted = events[0]["data"]
        assert submitted["scheduling"] == {
            "gpus": 0,
            "queue": "gpu",
            "priority": 5,
            "after": [],
            "after_any": [dep_id],
            "hold": True,
        }
        assert submitted["request_id"] and submitted["umask"]
        queue = await call(s, "queue", {})
        assert any(w["id"] == run_id and w["held"] and w["queue"] == "gpu" for w in queue["waiting"]), queue
        schemas.validate("queue", queue)
        js.cli("release", run_id)
        await call(s, "wait", {"runs": [run_id], "timeout_s": 60})
        assert (await call(s, "show", {"run": run_id}))["phase"] == "COMPLETED"

        before = _events_count(js)
        msg = await call_error(s, "submit", {"command": "true", "priority": 5000})
        assert msg.startswith("priority: "), msg
        msg = await call_error(s, "submit", {"command": "true", "after": ["ffffffffffff"]})
        assert msg.startswith("--after ffffffffffff: "), msg
        assert _events_count(js) == before


async def test_no_daemon_and_no_autostart_is_a_tool_error(tmp_path: Path) -> None:
    with jobsup_env(tmp_path) as env:  # never started
        async with mcp(env, tmp_path) as s:
            msg = await call_error(s, "runs", {})
            assert "no jobsup daemon answers" in msg
            doc = await call(s, "doctor", {})
            assert doc["ok"] is False and doc["checks"][0]["name"] == "daemon"


async def test_cancelled_wait_stops_the_server_side_wait(js: JobsupEnv, repo: Path) -> None:
    """The client's notifications/cancelled ends the server's wait: its
    daemon wait slices stop within one slice (in process, so the server's
    limiter shows the slices still running; without cancellation handling
    one would keep running for the whole 600 s)."""
    import os

    from mcp.shared.memory import create_client_server_memory_streams

    from supervisord.client.api import Client
    from supervisord.client.mcp import server as mcp_server
    from supervisord.shared.paths import Paths

    run_id = js.submit(repo, "--name", "mcp-inproc", "--", "sh", "sleep.sh")
    old = {k: os.environ.get(k) for k in ("JOBSUP_STATE_DIR", "JOBSUP_SOCKET")}
    os.environ.update({k: js.env[k] for k in old})
    try:
        client = Client(Paths.from_env())
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    handlers = mcp_server.Handlers(mcp_server.JobsupTools(client, cwd=repo))
    server = mcp_server.build_server(handlers)
    try:
        async with (
            create_client_server_memory_streams() as (client_streams, server_streams),
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(
                lambda: server.run(server_streams[0], server_streams[1], server.create_initialization_options())
            )
            async with ClientSession(*client_streams) as s:
                await s.initialize()
                with anyio.move_on_after(1.5) as scope:
                    await s.call_tool("wait", {"runs": [run_id], "timeout_s": 600})
                assert scope.cancelled_caught
                assert handlers.waits.borrowed_tokens >= 0
                with anyio.fail_after(mcp_server.WAIT_SLICE_S * 5 + 5):
                    while handlers.waits.borrowed_tokens:
                        await anyio.sleep(0.05)
            tg.cancel_scope.cancel()
    finally:
        js.cli("cancel", run_id)
        client.close()


async def test_sweep_tool_runs_filters_and_sweep_cancel(js: JobsupEnv, repo: Path) -> None:
    sweep = js.cli("submit", "--label", "k=v", "--sweep", "n=1..3", "--", "sleep 1{n}00", cwd=repo).stdout.strip()
    async with mcp(js, repo) as s:
        doc = await call(s, "sweep", {"sweep": sweep[:6], "sort": "-n"})
        assert doc["sweep"]["id"] == sweep and doc["params"] == ["n"]
        assert [r["params"]["n"] for r in doc["rows"]] == ["3", "2", "1"]
        assert "sort: --sort 'nope'" in await call_error(s, "sweep", {"sweep": sweep, "sort": "nope"})
        listed = await call(s, "runs", {"labels": {"k": "v"}, "sweep": sweep})
        assert len(listed["runs"]) == 3 and all(r["sweep_id"] == sweep for r in listed["runs"])
        assert (await call(s, "runs", {"labels": {"k": "other"}}))["runs"] == []
        done = await call(s, "cancel", {"runs": [sweep]})
        assert sorted(r["phase"] for r in done["runs"]) == ["CANCELED"] * 3
        waited = await call(s, "wait", {"runs": [sweep], "timeout_s": 30})
        assert waited["outcome"] == "met" and waited["exit_code"] == 3 and len(waited["runs"]) == 3


async def test_submit_tool_takes_a_sweep_labels_and_max_parallel(js: JobsupEnv, repo: Path) -> None:
    async with mcp(js, repo) as s:
        got = await call(
            s,
            "submit",
            {"command": "echo n={n} lr={lr}", "sweep": {"n": "1..2", "lr": [0.1, "1e-3"]}, "max_parallel": 1,
             "labels": {"team": "a"}},
        )  # fmt: skip
        sweep = got["sweep"]["id"]
        assert sweep.startswith("s") and len(got["run_ids"]) == 4 and "run" not in got
        waited = await call(s, "wait", {"runs": [sweep], "timeout_s": 120})
        assert waited["outcome"] == "met" and waited["exit_code"] == 0 and len(waited["runs"]) == 4
        table = await call(s, "sweep", {"sweep": sweep})
        assert sorted((r["params"]["n"], r["params"]["lr"]) for r in table["rows"]) == [
            ("1", "0.1"), ("1", "1e-3"), ("2", "0.1"), ("2", "1e-3")
        ]  # fmt: skip
        listed = await call(s, "runs", {"labels": {"team": "a"}, "sweep": sweep})
        assert len(listed["runs"]) == 4
        assert "{x}" in await call_error(s, "submit", {"command": "echo {x}", "sweep": {"n": [1]}})
        assert "max_parallel" in await call_error(s, "submit", {"command": "true", "max_parallel": 2})
        assert (await call(s, "runs", {"all": True, "labels": {"team": "b"}}))["runs"] == []


async def test_control_tools_hold_update_release_pause_resume_rerun(js: JobsupEnv, repo: Path) -> None:
    async with mcp(js, repo) as s:
        run = (await call(s, "submit", {"command": "sh sleep.sh", "name": "mcp-ctl", "hold": True}))["run"]
        held = (await call(s, "hold", {"runs": [run["id"]]}))["runs"][0]
        assert (held["phase"], held["reason"]) == ("QUEUED", "Held")
        upd = await call(s, "update", {"runs": [run["id"]], "priority": 9})
        assert upd["updated"][run["id"]] == {"old": {"priority": 0}, "new": {"priority": 9}}
        assert "at least one" in await call_error(s, "update", {"runs": [run["id"]]})
        await call(s, "release", {"runs": [run["id"]]})
        await call(s, "wait", {"runs": [run["id"]], "for": "RUNNING", "timeout_s": 60})
        paused = (await call(s, "pause", {"runs": [run["id"]]}))["runs"][0]
        assert paused["reason"] == "Paused"
        assert (await call(s, "resume", {"runs": [run["id"]]}))["runs"][0]["reason"] is None
        assert "only a queued run can be held" in await call_error(s, "hold", {"runs": [run["id"]]})
        await call(s, "cancel", {"runs": [run["id"]]})
        again = await call(s, "rerun", {"run": run["id"], "command": "echo again"})
        assert again["rerun_of"] == run["id"] and again["dependents"] == []
        done = await call(s, "wait", {"runs": [again["run"]["id"]], "timeout_s": 60})
        assert done["outcome"] == "met" and done["exit_code"] == 0


async def test_submit_takes_a_retry_policy_and_show_and_logs_give_the_attempts(js: JobsupEnv, repo: Path) -> None:
    mark = js.root / "mcp-retry-mark"
    command = f"if [ -e {mark} ]; then echo second; else touch {mark}; echo first; exit 9; fi"
    async with mcp(js, repo) as s:
        policy = {"attempts": 1, "on": ["exit:9"], "backoff": "0s"}
        out = await call(s, "submit", {"command": command, "name": "mcp-retry", "force": True, "retry": policy})
        run_id = out["run"]["id"]
        await call(s, "wait", {"runs": [run_id], "timeout_s": 60})
        run = await call(s, "show", {"run": run_id})
        assert (run["phase"], run["attempt"]) == ("COMPLETED", 2), run
        assert run["retry"] == {"attempts": 1, "on": ["exit:9"], "backoff_s": 0.0}
        assert [(a["attempt"], a["exit_code"]) for a in run["attempts"]] == [(1, 9), (2, 0)]
        schemas.validate("run-detail", run)
        second = await call(s, "logs", {"run": run_id, "attempt": 2})
        assert [(x["text"], x["attempt"]) for x in second["lines"]] == [("second", 2)]
        before = _events_count(js)
        msg = await call_error(s, "submit", {"command": "true", "retry": {"attempts": 2, "on": ["Bogus"]}})
        assert "'Bogus' is not a failure reason" in msg, msg
        assert _events_count(js) == before
