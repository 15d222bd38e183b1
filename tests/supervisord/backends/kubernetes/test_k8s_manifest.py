"""Reading the manifest from the recorded commit of a real git repository."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from supervisord.daemon.backends.kubernetes import load_manifest_at_commit
from supervisord.shared.exceptions import ManifestError
from tests.supervisord.jobsup_env import make_repo


def git(repo: Path, *args: str) -> str:
    """Run git in ``repo`` (as a committer named t); its stdout, stripped."""
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
        "HOME": str(repo),
        "PATH": "/usr/bin:/bin:/usr/local/bin",
    }
    out = subprocess.run(["git", "-C", str(repo), *args], env=env, check=True, capture_output=True, text=True)
    return out.stdout.strip()


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    return make_repo(
        tmp_path / "repo", {".jobsup/k8s.yaml": "kind: Job  # committed\n", "infra/run.yaml": "kind: Job  # infra\n"}
    )


def test_reads_the_committed_text_not_the_working_tree(repo: Path) -> None:
    commit = git(repo, "rev-parse", "HEAD")
    (repo / ".jobsup" / "k8s.yaml").write_text("kind: Job  # edited, not committed\n")
    assert load_manifest_at_commit(repo, commit, ".jobsup/k8s.yaml") == "kind: Job  # committed\n"
    assert load_manifest_at_commit(repo, commit, "./infra/run.yaml") == "kind: Job  # infra\n"
    assert load_manifest_at_commit(repo, commit, "infra/../infra/run.yaml") == "kind: Job  # infra\n"


def test_an_older_commit_gives_its_own_text(repo: Path) -> None:
    first = git(repo, "rev-parse", "HEAD")
    (repo / ".jobsup" / "k8s.yaml").write_text("kind: Job  # second\n")
    git(repo, "commit", "-q", "-am", "two")
    assert load_manifest_at_commit(repo, first, ".jobsup/k8s.yaml") == "kind: Job  # committed\n"


def test_missing_at_the_commit_says_to_write_and_commit_it(repo: Path) -> None:
    commit = git(repo, "rev-parse", "HEAD")
    with pytest.raises(ManifestError) as info:
        load_manifest_at_commit(repo, commit, "new.yaml")
    message = str(info.value)
    assert f"no Kubernetes manifest at 'new.yaml' in commit {commit[:12]}" in message
    assert "commit it" in message
    assert "--manifest PATH" in message
    assert "kubernetes.manifest" in message


def test_only_in_the_working_tree_says_so(repo: Path) -> None:
    commit = git(repo, "rev-parse", "HEAD")
    (repo / "infra" / "new.yaml").write_text("kind: Job\n")  # exists, but only in the working tree
    for path in ("infra/new.yaml", "./infra/new.yaml"):
        with pytest.raises(ManifestError) as info:
            load_manifest_at_commit(repo, commit, path)
        assert str(info.value).startswith(
            f"Kubernetes manifest 'infra/new.yaml' exists in the working tree but not in commit {commit[:12]}: commit it"
        ), str(info.value)


@pytest.mark.parametrize(
    ("path", "phrase"), [("/etc/passwd", "absolute"), ("../x.yaml", "leaves the repository"), (" ", "empty")]
)
def test_paths_outside_the_repository_are_rejected(repo: Path, path: str, phrase: str) -> None:
    commit = git(repo, "rev-parse", "HEAD")
    with pytest.raises(ManifestError, match=phrase):
        load_manifest_at_commit(repo, commit, path)


def test_non_utf8_manifest_is_an_error(repo: Path) -> None:
    (repo / "bin.yaml").write_bytes(b"kind: \xff\xfe\n")
    git(repo, "add", "bin.yaml")
    git(repo, "commit", "-q", "-m", "bin")
    commit = git(repo, "rev-parse", "HEAD")
    with pytest.raises(ManifestError, match="not UTF-8"):
        load_manifest_at_commit(repo, commit, "bin.yaml")
