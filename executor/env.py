"""Choices read from the environment (``$GEMTWIN_*``), checked with a one-line error."""

from __future__ import annotations

import os


def env_choice(var: str, choices: tuple[str, ...], default: str = "auto") -> str:
    """``$var`` if it is one of ``choices`` (``default`` when unset); else a ``ValueError`` naming
    the variable, its value and the choices."""
    kind = os.environ.get(var, default)
    if kind not in choices:
        raise ValueError(f"{var} = '{kind}': use {', '.join(choices[:-1])} or {choices[-1]}")
    return kind


def env_flag(var: str) -> bool | None:
    """``$var`` as an on/off switch: 1/true/yes/on → True, 0/false/no/off → False, unset or auto →
    None (the caller's default); anything else a ``ValueError`` naming the variable and value."""
    value = os.environ.get(var, "").strip().lower()
    if value in ("", "auto"):
        return None
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{var} = '{value}': use 1 or 0")
