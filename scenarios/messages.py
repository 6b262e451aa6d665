"""How every error message echoes a user's value: on one line, and short.

DESIGN rule 8: bad input gets one line naming the field, the value and the fix. The value is the
user's, and can be anything: a whole RunRecord passed where a calibration was expected, a
5,000-deep list. So messages echo it through ``short``, never whole.
"""

from __future__ import annotations

from typing import Any

ECHO_LIMIT = 60  # characters of a value that an error message echoes


def short(value: Any, limit: int = ECHO_LIMIT) -> str:
    """``repr(value)`` on one line, cut to ``limit`` characters with ``...``."""
    text = one_line(_repr(value))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def one_line(text: str) -> str:
    """Whitespace, newlines included, folded to single spaces."""
    return " ".join(str(text).split())


def _repr(value: Any) -> str:
    try:
        return repr(value)
    except RecursionError:  # a structure too deep to print
        return f"<{type(value).__name__} nested too deep to print>"


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``count(1, "GPU")`` -> "1 GPU", ``count(4096, "GPU")`` -> "4,096 GPUs"."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"
