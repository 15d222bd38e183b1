"""Imports every command module so that each registers its commands on ``cli``."""

from __future__ import annotations
