"""Shared helpers: read the bundled YAML data files and build one-line lookup errors."""

from __future__ import annotations

from functools import cache
from importlib.resources import files
from typing import Any

import yaml

DATA_DIR = files("hwmodels") / "data"


@cache
def load_yaml(relpath: str) -> dict[str, Any]:
    """Parse `hwmodels/data/<relpath>`; cached, so callers must not mutate the result."""
    text = DATA_DIR.joinpath(relpath).read_text(encoding="utf-8")
    return yaml.safe_load(text)


def unknown(thing: str, name: str, known: list[str]) -> ValueError:
    """`unknown GPU 'h300'; known: b200, gb200, ...` as a ValueError."""
    return ValueError(f"unknown {thing} {name!r}; known: {', '.join(sorted(known))}")
