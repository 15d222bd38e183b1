"""The gated script: what ``JOBSUP_SCRIPT`` holds inside the script container.

jobsup copies the source snapshot (``git archive`` of the recorded commit)
into the running pod as ``/tmp/jobsup-source/source.tar``, then creates
``source.tar.ready`` (a copy is not atomic; the marker says it is complete).
The script, run by the manifest's ``bash -c 'eval "$JOBSUP_SCRIPT"'``:

1. ``set -euo pipefail``;
2. waits for the marker, polling every 0.2 s, and gives up after the staging
   deadline with a message on stderr and exit code
   :data:`STAGING_TIMEOUT_EXIT_CODE`;
3. extracts ``source.tar`` into ``repo/`` under the container's working
   directory (the image ``WORKDIR`` or the container's ``workingDir``);
4. ``cd repo`` and runs the task's command, which is the user's own shell
   text, appended as written, in a background subshell, and waits for it
   (a background command's stdin is ``/dev/null``, as a container's is);
5. on SIGTERM, ignores further SIGTERMs itself and sends SIGTERM to its
   whole process group (the command and everything it started; ``kill 0``),
   keeps waiting, then exits with the command's exit status.

Step 5 exists because the kubelet stops a container by sending SIGTERM to
its main process only (PID 1 of the container), and the kernel delivers a
signal to a PID namespace's init only when it has a handler for it: a bare
``bash -c`` as PID 1 ignores SIGTERM, the command never hears of a cancel
or deadline, and the container is SIGKILLed after the grace period
(terminationGracePeriodSeconds, default 30 s). With the trap the command
gets SIGTERM at once, as local runs do. Before the command starts, SIGTERM
ends the script (exit 143). Job control (``set -m``) is not used for this:
bash then prints job notices ("[1]+ Done") into the log.

The image needs ``bash`` and ``tar``. The staging folder may be overridden
with ``JOBSUP_STAGING_DIR`` (meant for tests of the script itself).
"""

from __future__ import annotations

import re
import shlex

__all__ = [
    "READY_MARKER",
    "SOURCE_TAR",
    "STAGING_DIR",
    "STAGING_TIMEOUT_EXIT_CODE",
    "gated_script",
]

#: Where jobsup copies the source archive in the pod.
STAGING_DIR = "/tmp/jobsup-source"  # noqa: S108 - a path inside the pod, made by the staging script
#: The archive's file name in :data:`STAGING_DIR`.
SOURCE_TAR = "source.tar"
#: Created by jobsup once the archive is complete.
READY_MARKER = "source.tar.ready"
#: The script's exit code when the source never arrived (EX_TEMPFAIL, sysexits.h).
STAGING_TIMEOUT_EXIT_CODE = 75

_SAFE_DIR = re.compile(r"^/[A-Za-z0-9._/-]+$")


def gated_script(command: str, *, staging_timeout_s: int, staging_dir: str = STAGING_DIR) -> str:
    """The bash program for ``JOBSUP_SCRIPT``: wait (at most
    ``staging_timeout_s`` seconds, > 0) for ``<staging_dir>/source.tar.ready``,
    extract ``source.tar`` into ``./repo``, ``cd`` there and run ``command``.

    ``command`` is bash text and runs as written (it is the user's shell
    command line; it is not quoted). Raises ValueError for an empty command,
    a non-positive timeout or a staging dir that is not a plain absolute path.
    """
    if not command.strip():
        raise ValueError("the task's command is empty")
    if isinstance(staging_timeout_s, bool) or not isinstance(staging_timeout_s, int) or staging_timeout_s <= 0:
        raise ValueError(f"staging_timeout_s must be a positive whole number of seconds, got {staging_timeout_s!r}")
    if not _SAFE_DIR.match(staging_dir):
        raise ValueError(f"staging_dir must be a plain absolute path, got {staging_dir!r}")
    timeout_msg = shlex.quote(
        f"jobsup: gave up waiting for the source snapshot: the ready marker did not appear within "
        f"{staging_timeout_s}s (staging deadline); the pod started but jobsup could not copy the source in"
    )
    lines = [
        "set -euo pipefail",
        "trap 'exit 143' TERM",
        f"jobsup_staging=${{JOBSUP_STAGING_DIR:-{staging_dir}}}",
        f"jobsup_deadline=$((SECONDS + {staging_timeout_s}))",
        f'until [ -e "$jobsup_staging/{READY_MARKER}" ]; do',
        '  if [ "$SECONDS" -ge "$jobsup_deadline" ]; then',
        f'    echo {timeout_msg} "($jobsup_staging/{READY_MARKER})" >&2',
        f"    exit {STAGING_TIMEOUT_EXIT_CODE}",
        "  fi",
        "  sleep 0.2",
        "done",
        "mkdir -p repo",
        f'tar -xf "$jobsup_staging/{SOURCE_TAR}" -C repo',
        "cd repo",
        "(",
        command.rstrip("\n"),
        ") &",
        "jobsup_child=$!",
        """trap 'trap "" TERM; kill -TERM 0 2>/dev/null || true' TERM""",
        "set +e",
        'while kill -0 "$jobsup_child" 2>/dev/null; do wait "$jobsup_child"; done',
        'wait "$jobsup_child"',
        "exit $?",
    ]
    return "\n".join(lines) + "\n"
