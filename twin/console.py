"""The CLI's two consoles, and the one way it prints an error or a warning.

Nothing the CLI prints is rich markup: messages carry user text, paths and install hints such as
``-e '.[exec]'``, and rich would read ``[exec]`` as a style tag and drop it. So both consoles are
built with ``markup=False`` and ``highlight=False``, and the ``error:`` / ``warning:`` prefixes
are styled with ``Text`` objects rather than tags.

    from twin.console import error, out, warning
    out.print(table)
    warning("does not fit: ...")
"""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from scenarios.messages import one_line

out = Console(markup=False, highlight=False)
err = Console(stderr=True, markup=False, highlight=False)

LINE_LIMIT = 600  # characters of one error line; its head (what) and tail (the fix) are kept


def error(message: str) -> None:
    """``error: <message>`` on stderr, on one line (of at most ``LINE_LIMIT`` characters)."""
    err.print(Text.assemble(("error:", "bold red"), " ", _capped(one_line(message))), soft_wrap=True)


def warning(message: str) -> None:
    """``warning: <message>`` on stderr, on one line."""
    err.print(Text.assemble(("warning:", "bold yellow"), " ", _capped(one_line(message))), soft_wrap=True)


def _capped(line: str) -> str:
    if len(line) <= LINE_LIMIT:
        return line
    head, tail = LINE_LIMIT * 2 // 3, LINE_LIMIT // 3 - 5
    return f"{line[:head]} ... {line[-tail:]}"


def install_hint(extra: str) -> str:
    """The exact command that adds the optional dependencies ``extra`` to this environment.

    gemtwin is installed from its checkout (it is not on a package index), into the venv the
    README's set-up builds with uv, which has no pip of its own. So the hint names uv, this
    venv and this checkout, relative to the working folder when they are under it.
    """
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    if not (root / "pyproject.toml").is_file():
        return (f"reinstall gemtwin from its git checkout with the {extra!r} extra: "
                f"uv pip install -p .venv -e '.[{extra}]' (run in the checkout)")  # fmt: skip
    return f"uv pip install -p {_here(Path(sys.prefix))} -e '{_here(root)}[{extra}]'"


def _here(path) -> str:
    from pathlib import Path

    try:
        rel = path.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        return str(path)
    return str(rel) if str(rel) != "." else "."
