"""GPU discovery (nvidia-smi output, configured lists), a run's GPU env, and
the submit options' checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisord.daemon.scheduler.gpus import (
    gpu_env,
    inventory,
    parse_nvidia_smi,
    query_nvidia_smi,
)
from supervisord.daemon.scheduler.policy import Gpu
from supervisord.shared.exceptions import ConfigError, TaskError
from supervisord.shared.scheduling import parse_scheduling

SMI = "0, GPU-aaa, NVIDIA A100-SXM4-40GB, 40960 MiB\n1, GPU-bbb, NVIDIA A100-SXM4-40GB, 40960 MiB\n"


def test_parse_nvidia_smi() -> None:
    gpus = parse_nvidia_smi(SMI)
    assert gpus == [
        Gpu(0, "GPU-aaa", "NVIDIA A100-SXM4-40GB", "40960 MiB"),
        Gpu(1, "GPU-bbb", "NVIDIA A100-SXM4-40GB", "40960 MiB"),
    ]
    with pytest.raises(ValueError, match="unexpected nvidia-smi line"):
        parse_nvidia_smi("garbage\n")


def test_query_runs_the_tool_and_notes_failures(tmp_path: Path) -> None:
    assert query_nvidia_smi(lambda _: None)[1] is not None
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        '#!/bin/sh\n[ "$1" = --query-gpu=index,uuid,name,memory.total ] || exit 9\nprintf \''
        + SMI.replace("\n", "\\n")
        + "'\n"
    )
    smi.chmod(0o755)
    gpus, note = query_nvidia_smi(lambda _: str(smi))
    assert note is None and [g.uuid for g in gpus] == ["GPU-aaa", "GPU-bbb"]
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    gpus, note = query_nvidia_smi(lambda _: str(smi))
    assert gpus == [] and note is not None and "exited 9" in note and "NVIDIA-SMI has failed" in note


def test_inventory_from_config() -> None:
    found = parse_nvidia_smi(SMI)
    assert [g.uuid for g in inventory([1], lambda: (found, None)).gpus] == ["GPU-bbb"]
    assert [g.index for g in inventory(["GPU-aaa"], lambda: (found, None)).gpus] == [0]
    assert [g.uuid for g in inventory([0, 3], lambda: ([], "absent")).gpus] == ["0", "3"]
    assert inventory("auto", lambda: ([], "absent")).note == "absent"
    with pytest.raises(ConfigError, match=r"scheduler.gpus\[0\]: nvidia-smi lists no GPU 7"):
        inventory([7], lambda: (found, None))
    with pytest.raises(ConfigError, match="listed twice"):
        inventory([0, "GPU-aaa"], lambda: (found, None))


def test_gpu_env() -> None:
    g = [Gpu(2, "GPU-x"), Gpu(5, "GPU-y")]
    assert gpu_env(g, managed=True, cpu_runs_see_gpus=False) == {
        "CUDA_VISIBLE_DEVICES": "GPU-x,GPU-y",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "JOBSUP_GPUS": "2,5",
    }
    assert gpu_env([], managed=True, cpu_runs_see_gpus=False) == {"CUDA_VISIBLE_DEVICES": ""}
    assert gpu_env([], managed=True, cpu_runs_see_gpus=True) == {}
    assert gpu_env([], managed=False, cpu_runs_see_gpus=False) == {}


@pytest.mark.parametrize(
    "task,flag",
    [
        ({"gpus": -1}, "--gpus"),
        ({"gpus": True}, "--gpus"),
        ({"priority": 1001}, "--priority"),
        ({"priority": "high"}, "--priority"),
        ({"queue": "no spaces"}, "--queue"),
        ({"after": ["xyz!"]}, "--after"),
        ({"after_any": "abc"}, "--after-any"),
    ],
)
def test_parse_scheduling_refuses(task: dict[str, object], flag: str) -> None:
    with pytest.raises(TaskError, match=flag):
        parse_scheduling(task)


def test_parse_scheduling_defaults_and_dedup() -> None:
    assert parse_scheduling({}) == {
        "gpus": 0,
        "queue": "default",
        "priority": 0,
        "after": [],
        "after_any": [],
        "hold": False,
    }
    got = parse_scheduling({"after": ["ABCD", "abcd"], "after_any": ["abcd", "beef"]}, hold=True)
    assert got["after"] == ["abcd"] and got["after_any"] == ["beef"] and got["hold"] is True


def test_max_running_is_the_default_queues_cap() -> None:
    from supervisord.daemon.scheduler.driver import SchedulerSettings

    s = SchedulerSettings.from_config(
        {"daemon": {"max_running": 3}, "scheduler": {"queues": {"gpu": {"max_parallel": 1}}}}
    )
    assert s.caps == {"gpu": 1, "default": 3}
    s = SchedulerSettings.from_config(
        {"daemon": {"max_running": 3}, "scheduler": {"queues": {"default": {"max_parallel": 5}}}}
    )
    assert s.caps == {"default": 5}
    assert SchedulerSettings.from_config({}).caps == {} and not SchedulerSettings.from_config({}).cpu_runs_see_gpus


def test_scheduler_config_keys_validate() -> None:
    from supervisord.shared.config.schema import validate_document

    assert (
        validate_document(
            {"scheduler": {"gpus": [0, "GPU-x"], "queues": {"gpu": {"max_parallel": 2}}, "cpu_runs_see_gpus": True}}
        )
        == []
    )
    errors = validate_document({"scheduler": {"gpus": "all", "queues": {"gpu": {"max_parallel": 0}}, "extra": 1}})
    assert any(e.startswith("scheduler.gpus") for e in errors)
    assert any(e.startswith("scheduler.queues.gpu.max_parallel") for e in errors)
    assert any(e.startswith("scheduler.extra") for e in errors)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("gpus: -1", "gpus"),
        ("gpus: 5000", "gpus"),
        ("queue: ../x", "queue"),
        ("priority: 1001", "priority"),
        ("after: ['xyz!']", "after"),
        ("priority: 1_000", "priority"),  # YAML 1.1 reads these as numbers nobody wrote
        ("gpus: 0x2", "gpus"),
        ("gpus: 1:30", "gpus"),
    ],
)
def test_a_task_files_scheduling_errors_name_the_file_and_key(tmp_path: Path, text: str, key: str) -> None:
    from supervisord.shared.task import load_task

    task_file = tmp_path / "task.yaml"
    task_file.write_text(f"run: echo\n{text}\n")
    with pytest.raises(TaskError) as caught:
        load_task(task_file)
    assert str(caught.value).startswith(f"{task_file.resolve()}: `{key}`: ") or str(caught.value).startswith(
        f"{task_file}: `{key}`: "
    ), caught.value
    assert f"--{key}" not in str(caught.value), caught.value  # not the CLI flag: the file's key
