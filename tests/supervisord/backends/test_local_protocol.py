"""The local runner's shared formats live in one standard-library module,
supervisord/daemon/backends/local/protocol.py, which the isolated runner imports
from its folder and the daemon from the package: one codec, both sides."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from supervisord.daemon.backends.local import protocol, runner

FOLDER = Path(runner.__file__).parent


def test_the_protocol_module_imports_only_the_standard_library() -> None:
    tree = ast.parse((FOLDER / "protocol.py").read_text())
    imported = {
        (node.module or "") if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    assert {m.split(".")[0] for m in imported} <= set(sys.stdlib_module_names) | {"__future__"}, imported


def test_the_runner_and_the_daemon_share_one_codec() -> None:
    assert runner.encode_status is protocol.encode_status and runner.STDOUT == protocol.STDOUT
    key = b"k" * 32
    status = {"state": "exited", "exit_code": 3, "signal": None, "reason": "NonZeroExit", "message": "é\n"}
    # The runner as it runs: isolated, imported from its folder.
    code = (
        f"import sys; sys.path.insert(0, {str(FOLDER)!r}); import runner\n"
        f"assert runner.encode_status.__module__ == 'protocol', runner.encode_status.__module__\n"
        "assert not [m for m in sys.modules if m.startswith('supervisord')]\n"
        f"sys.stdout.write(runner.encode_status({status!r}, {key!r}).hex())\n"
    )
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, check=True).stdout
    data = bytes.fromhex(out)
    assert len(data) == protocol.STATUS_SIZE
    assert protocol.decode_status(data, key) == status
    assert protocol.decode_status(data, b"x" * 32) is None  # another key: not the runner's
    assert json.loads(data.split(b"\n", 1)[0]) == status
