"""The Slurm backend's pure parts: Slurm's answers -> phase and reason, the
sbatch command and the wrapper (no cluster needed)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from supervisord.daemon.backends.slurm.poller import LogChunk, parse_poll, poll_script
from supervisord.daemon.backends.slurm.status import (
    JobRecord,
    elapsed_seconds,
    observe,
    parse_accounting,
    parse_scontrol,
    parse_squeue,
)
from supervisord.shared.exceptions import ConfigError
from supervisord.shared.slurmscript import (
    SlurmSettings,
    array_spec,
    env_file,
    remote_dir_expr,
    sbatch_argv,
    time_limit,
    wrapper_script,
)


def rec(state: str, code: int | None = None, sig: int | None = None, reason: str = "") -> JobRecord:
    return JobRecord("7", state, reason, code, sig)


@pytest.mark.parametrize(
    ("record", "exit_file", "tail", "want"),
    [
        (rec("PENDING", reason="Resources"), None, "", ("SCHEDULING", "WaitingForSlurm")),
        (rec("RUNNING"), None, "", ("RUNNING", None)),
        (rec("COMPLETING"), None, "", ("RUNNING", None)),
        (rec("COMPLETED", 0, 0), None, "", ("COMPLETED", None)),
        (rec("FAILED", 3, 0), None, "", ("ERROR", "NonZeroExit")),
        (
            rec("FAILED", 0, 9),
            None,
            "StepId=8.batch exceeded memory limit (9 > 4), being killed",
            ("ERROR", "OOMKilled"),
        ),
        (rec("FAILED", 0, 9), None, "", ("ERROR", "NonZeroExit")),
        (rec("OUT_OF_MEMORY", 0, 125), None, "", ("ERROR", "OOMKilled")),
        (rec("TIMEOUT", 0, 15), None, "", ("ERROR", "DeadlineExceeded")),
        (rec("DEADLINE"), None, "", ("ERROR", "DeadlineExceeded")),
        (rec("PREEMPTED"), None, "", ("ERROR", "Preempted")),
        (rec("NODE_FAIL"), None, "", ("ERROR", "NodeFailure")),
        (rec("BOOT_FAIL"), None, "", ("ERROR", "NodeFailure")),
        (rec("CANCELLED", 0, 15), None, "", ("CANCELED", "Canceled")),
        # The exit-code file first: it is the command's own word.
        (rec("RUNNING"), 0, "", ("COMPLETED", None)),
        (rec("RUNNING"), 3, "", ("ERROR", "NonZeroExit")),
        (None, 5, "", ("ERROR", "NonZeroExit")),
        # ... but not over Slurm's kill for a time limit.
        (rec("TIMEOUT"), 143, "", ("ERROR", "DeadlineExceeded")),
        (rec("CANCELLED"), 143, "", ("CANCELED", "Canceled")),
        (rec("CANCELLED"), 0, "", ("COMPLETED", None)),
    ],
)
def test_observe(record: JobRecord | None, exit_file: int | None, tail: str, want: tuple[str, str | None]) -> None:
    obs = observe(record, exit_file=exit_file, output_tail=tail)
    assert obs is not None and (obs.phase, obs.reason) == want, obs


def test_observe_messages_and_codes() -> None:
    pending = observe(rec("PENDING", reason="Priority"), exit_file=None)
    assert pending is not None and pending.message == "Slurm job 7 is PENDING (Priority)"
    failed = observe(rec("FAILED", 3, 0), exit_file=None)
    assert failed is not None and failed.exit_code == 3
    theirs = observe(rec("CANCELLED"), exit_file=None)
    assert theirs is not None and "outside jobsup" in (theirs.message or "")
    ours = observe(rec("CANCELLED"), exit_file=None, canceled_by_jobsup=True)
    assert ours is not None and ours.message == "canceled by request"
    assert observe(None, exit_file=None) is None


def test_parsers() -> None:
    q = parse_squeue("12|PENDING|Resources|0:00\n13|CANCELLED by 0|None|1:02:03\nbad\n")
    assert q["12"].state == "PENDING" and q["12"].reason == "Resources"
    assert q["13"].state == "CANCELLED" and q["13"].elapsed_s == 3723
    assert elapsed_seconds("2-01:00:00") == 2 * 86400 + 3600 and elapsed_seconds("INVALID") is None
    a = parse_accounting("12|FAILED|3:0\n12.batch|FAILED|3:0\n", "12")
    assert a is not None and (a.state, a.exit_code, a.signal) == ("FAILED", 3, 0)
    assert parse_accounting("", "12") is None
    s = parse_scontrol(
        "JobId=12 JobName=x\n   JobState=TIMEOUT Reason=TimeLimit Dependency=(null)\n ExitCode=0:15\n", "12"
    )
    assert s is not None and (s.state, s.reason, s.signal) == ("TIMEOUT", "TimeLimit", 15)
    assert parse_scontrol("JobId=99 JobState=RUNNING", "12") is None


def test_poll_output_parsed(tmp_path: Path) -> None:
    """The poll script, run by bash over real files, and its parse."""
    done = tmp_path / "a"
    live = tmp_path / "b"
    for d in (done, live):
        d.mkdir()
        (d / "output.log").write_text("hello\n")
    (done / "exit_code").write_text("3\n")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "squeue").write_text("#!/bin/sh\necho '5|RUNNING|None|0:07'\n")
    (fake / "squeue").chmod(0o755)
    out = subprocess.run(
        ["bash", "-c", poll_script([str(done), str(live)])],
        capture_output=True,
        text=True,
        env={"PATH": f"{fake}:/usr/bin:/bin"},
        check=True,
    ).stdout
    cycle = parse_poll(1, out)
    assert cycle.squeue_ok and cycle.records["5"].elapsed_s == 7
    assert cycle.sizes == {str(done): 6, str(live): 6}
    assert cycle.exits == {str(done): 3}
    (fake / "squeue").write_text("#!/bin/sh\necho 'squeue: error: Unable to contact slurm controller' >&2\nexit 1\n")
    out = subprocess.run(
        ["bash", "-c", poll_script([str(done)])], capture_output=True, text=True, env={"PATH": f"{fake}:/usr/bin:/bin"}
    ).stdout
    cycle = parse_poll(2, out)
    assert not cycle.squeue_ok and "Unable to contact" in cycle.error and cycle.exits == {str(done): 3}


def test_sbatch_argv_and_settings() -> None:
    settings = SlurmSettings.of(
        {"slurm": {"partition": "gpu", "account": "lab", "qos": "high", "sbatch_args": ["--mem=4G"]}}
    )
    argv = sbatch_argv(run_id="abc", run_dir="/r/runs/abc", timeout_s=61, settings=settings, gpus=2)
    assert argv[:8] == [
        "sbatch",
        "--parsable",
        "--job-name=jobsup-abc",
        "--comment=jobsup:abc",
        "--output=/r/runs/abc/output.log",
        "--open-mode=append",
        "--time=2",
        "--chdir=/r/runs/abc",
    ]
    assert argv[8:] == ["--partition=gpu", "--account=lab", "--qos=high", "--gpus=2", "--mem=4G", "/r/runs/abc/job.sh"]
    assert time_limit(60) == "1" and time_limit(1) == "1" and time_limit(3600) == "60"
    with pytest.raises(ConfigError, match="slurm.sbatch_args"):
        SlurmSettings.of({"slurm": {"sbatch_args": "--mem=4G"}})
    assert SlurmSettings.of({}).remote_dir == "~/.jobsup"
    assert remote_dir_expr("~/x y") == "\"$HOME\"/'x y'" and remote_dir_expr("/a") == "/a"


def test_wrapper_runs_command_sources_env_and_keeps_it_for_a_requeue(tmp_path: Path) -> None:
    run_dir = tmp_path / "run dir"
    (run_dir / "src").mkdir(parents=True)
    (run_dir / "env.sh").write_bytes(env_file({"TOKEN": "it's $secret"}))
    script = wrapper_script(run_id="abc", run_dir=str(run_dir), command='echo "[$TOKEN]" >> seen; exit 4')
    (run_dir / "job.sh").write_text(script)
    for _ in range(2):  # run again from the start, as a requeued job does
        done = subprocess.run(["bash", str(run_dir / "job.sh")], check=False)
        assert done.returncode == 4
        assert (run_dir / "exit_code").read_text() == "4\n"
    assert (run_dir / "src" / "seen").read_text() == "[it's $secret]\n" * 2
    # The backend deletes it once the job left the queue.
    assert (run_dir / "env.sh").exists()


def test_memory_cpus_and_array_options() -> None:
    settings = SlurmSettings.of({"slurm": {"partition": "p"}})
    argv = sbatch_argv(
        run_id="s0123",
        run_dir="/r/sweeps/s0123-x",
        timeout_s=60,
        settings=settings,
        memory_bytes=(1 << 30) + 1,
        cpus=1.5,
        array=array_spec([0, 1, 2, 5, 7, 8], 2),
    )
    assert "--mem=1025M" in argv and "--cpus-per-task=2" in argv
    assert "--array=0-2,5,7-8%2" in argv and "--output=/r/sweeps/s0123-x/%a/output.log" in argv
    assert array_spec([3], None) == "3"


def test_array_tasks_in_sacct_c_and_scontrol() -> None:
    # sacct -c names an array task by its own job id; scontrol by ArrayJobId/ArrayTaskId.
    rec = parse_accounting("2|COMPLETED|0:0\n", "1_0")
    assert rec is not None and rec.job_id == "1_0" and rec.state == "COMPLETED"
    assert parse_accounting("2|COMPLETED|0:0\n3|FAILED|1:0\n", "1_0") is None
    text = "JobId=7 ArrayJobId=5 ArrayTaskId=2 JobName=x\n   JobState=FAILED Reason=NonZeroExitCode ExitCode=3:0\n"
    rec = parse_scontrol(text, "5_2")
    assert rec is not None and rec.state == "FAILED" and rec.exit_code == 3
    assert parse_scontrol(text, "5_3") is None


def test_poll_reads_each_grown_log_in_the_same_command(tmp_path: Path) -> None:
    """One command per cycle reads every followed log from its offset
    (over ssh: one round trip for all runs' logs)."""
    a, b, c = tmp_path / "a", tmp_path / "b b", tmp_path / "c"
    for d, text in ((a, b"hello\nworld\n"), (b, b"x|y\n@@jobsup@@\npartial"), (c, b"old\n")):
        d.mkdir()
        (d / "output.log").write_bytes(text)
    script = poll_script([str(a), str(b), str(c)], {str(a): 3, str(b): 0, str(c): 4})
    out = subprocess.run(["bash", "-c", script], capture_output=True, check=False).stdout
    cycle = parse_poll(1, out)
    assert cycle.logs == {
        str(a): LogChunk(3, b"lo\nworld\n"),
        str(b): LogChunk(0, b"x|y\n@@jobsup@@\npartial"),
    }
    assert cycle.sizes[str(c)] == 4 and str(c) not in cycle.logs


def test_a_requeued_jobs_latest_completion_record_counts() -> None:
    # The jobcomp file logs the requeue (PENDING), then the real end: the
    # run followed the first line for ever before (it never ended).
    text = "148|PENDING|0:0\n148|FAILED|1:0\n"
    rec = parse_accounting(text, "148")
    assert rec is not None and rec.state == "FAILED" and rec.exit_code == 1
    rec = parse_accounting("9|PENDING|0:0\n9|COMPLETED|0:0\n", "4_2")
    assert rec is not None and rec.state == "COMPLETED"
