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
