"""Flags that other tools take to shape compute (``--image``, ``--gpus``...).

jobsup refuses them with a pointer to the manifest: for Kubernetes the
committed manifest is the run's shape, and a local run uses this machine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from supervisord.shared.exceptions import UsageError

__all__ = ["reject_shape_flags", "shape_flag_options", "shape_flag_options_without"]

F = TypeVar("F", bound=Callable[..., Any])

_MANIFEST = ".jobsup/k8s.yaml"
SHAPE_FLAGS = {
    "image": "the container image",
    "gpus": "the GPU count (resources.limits: {nvidia.com/gpu: N})",
    "cpus": "CPU requests and limits",
    "memory": "memory requests and limits",
}


def shape_flag_options(fn: F) -> F:
    """Add the hidden ``--image/--gpus/--cpus/--memory`` options (so using
    one gets :func:`reject_shape_flags`' message, not click's generic one)."""
    for flag in reversed(SHAPE_FLAGS):
        fn = click.option(f"--{flag}", default=None, hidden=True)(fn)
    return fn


def shape_flag_options_without(*names: str) -> Callable[[F], F]:
    """:func:`shape_flag_options` without the flags in ``names`` (a command
    that takes one of them for real, e.g. submit's ``--gpus``)."""

    def deco(fn: F) -> F:
        for flag in reversed(SHAPE_FLAGS):
            if flag not in names:
                fn = click.option(f"--{flag}", default=None, hidden=True)(fn)
        return fn

    return deco


def reject_shape_flags(values: dict[str, Any]) -> None:
    """Raise UsageError naming the first shape flag given in ``values``."""
    for flag, what in SHAPE_FLAGS.items():
        if values.get(flag) is not None:
            raise UsageError(
                f"--{flag} does not shape a jobsup run: for Kubernetes the manifest "
                f"({_MANIFEST} or --manifest PATH, committed) is the run's shape; set {what} there"
            )
