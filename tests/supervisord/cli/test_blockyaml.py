"""``blockyaml.dump`` writes what ``yaml.safe_dump(v, sort_keys=False)`` does."""

from __future__ import annotations

import random
import subprocess
import sys
from typing import Any

import yaml

from supervisord.client.cli.blockyaml import dump

#: Scalars around every edge of PyYAML's plain style and its resolver.
_ATOMS: list[Any] = [
    "a", "x1", "_x", "a.b", "a-b", "a=b", "a+b", "a@b", "a:b", "sha256:4f2a", "/tmp/x", "nvidia.com/gpu",
    ".jobsup/k8s.yaml", "49724937c1", "12a", "1E5", "1e5", "0x1f", "0xg", "0b1", "0b2", "0o7", "123", "1_2", "1a_2",
    ".inf", ".Inf", ".nan", ".NaN", ".5", "._a", "yes", "Yes", "no", "on", "OFF", "y", "n", "null", "Null", "~", "~/.jobsup", "~x", "~:", "~-", "~1",
    "true", "None", "NaN", "inf", "2024-01-01", "a:", "-a", "", " a", "a b", "a#b", "a'b", 'a"b', "é", "a\nb",
    "a" * 99, "b" * 100, "c" * 130, "/d" * 200, "d" * 101, 0, -5, 10**30, True, False, None, 1.5,
]  # fmt: skip


def _value(rnd: random.Random, depth: int) -> Any:
    r = rnd.random()
    if depth > 3 or r < 0.4:
        atom = rnd.choice([*_ATOMS, "{}", "[]"])
        return {} if atom == "{}" else [] if atom == "[]" else atom
    keys = [a for a in _ATOMS if isinstance(a, str)] + ["k1", "k2"]
    if r < 0.7:
        return {rnd.choice(keys): _value(rnd, depth + 1) for _ in range(rnd.randint(0, 4))}
    return [_value(rnd, depth + 1) for _ in range(rnd.randint(0, 4))]


def test_same_text_as_pyyaml_on_generated_values() -> None:
    rnd = random.Random(20261201)
    shared: dict[str, Any] = {"k": 1}
    values = [{"a": shared, "b": shared}, [[], []], {"a": {}}, {"a": []}]  # aliases, flow empties
    values += [_value(rnd, 0) for _ in range(5000)]
    for v in values:
        if isinstance(v, (dict, list)):
            assert dump(v) == yaml.safe_dump(v, sort_keys=False), v


def test_a_show_document_needs_no_pyyaml() -> None:
    """What ``jobsup show`` prints for a local run is written without importing PyYAML."""
    code = (
        "import sys\n"
        "from supervisord.client.cli.blockyaml import dump\n"
        "dump({'repo': '/tmp/r', 'rev': 'HEAD', 'commit': '4b92' * 10, 'snapshot_sha256': '49724937c1c9a4ff' * 4,\n"
        "      'snapshot_size': 10240, 'env': {}, 'local': {'kill_grace_s': 10, 'shell': 'bash'},\n"
        "      'manifest': '.jobsup/k8s.yaml', 'repo_dir': '/tmp/pytest-of-u' + '/long-folder' * 20, 'tolerations': [], 'allowed_backends': ['local', 'kubernetes'],\n"
        "      'daemon': {'synchronous': 'FULL', 'log_level': 'info'}, 'runner_pid': 8424,\n"
        "      'slurm': {'sbatch_args': [], 'remote_dir': '~/.jobsup'}})\n"
        "assert 'yaml' not in sys.modules, 'imported PyYAML'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
