"""Writing files so that nothing already written is lost or left half-written (DESIGN rule 8)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to a temp file in the target's folder, fsync, rename over ``path``, fsync the folder.

    A reader sees the old file or the new one, never a mix; on any failure the temp file is
    removed and an existing ``path`` is untouched. The file gets the mode an existing one had
    (else the umask's default), not mkstemp's 0600.
    """
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{p} is a folder; give a file name inside it")
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        os.chmod(tmp, _file_mode(p))
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(p.parent)  # the rename itself durable: after a power loss the folder names the new file
    return p


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a folder (its entries: a rename into it); a no-op where folders cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """``write_bytes_atomic`` for UTF-8 text."""
    return write_bytes_atomic(path, text.encode("utf-8"))


def _file_mode(p: Path) -> int:
    """The mode an existing ``p`` has, else what a new file gets under the process umask."""
    try:
        return p.stat().st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


# What each kind of file gemtwin writes holds at its top level (all of these keys), so that a
# loader handed the wrong kind can say which kind it got instead of listing missing fields.
_FILE_KINDS: tuple[tuple[str, frozenset[str]], ...] = (
    ("a RunRecord (from gemtwin train)", frozenset({"run_id", "environment", "steps"})),
    ("a calibration (from gemtwin calibrate)", frozenset({"gpu", "runs", "scale"})),
    ("a simulate result (from gemtwin simulate --out)", frozenset({"step_time_s", "breakdown_s", "mfu"})),
    ("a forecast (from gemtwin forecast -o)", frozenset({"rows", "growth", "years"})),
    ("a hardware profile (from gemtwin hw probe -o)", frozenset({"gpus", "presets", "measurements"})),
    ("a scenario", frozenset({"model", "hardware"})),
    ("a scenario", frozenset({"extends"})),
)


def file_kind(data: object) -> str | None:
    """Which kind of gemtwin file ``data`` (a parsed YAML/JSON document) is, or None."""
    if not isinstance(data, dict):
        return None
    for kind, keys in _FILE_KINDS:
        if keys <= data.keys():
            return kind
    return None


def wrong_kind(path: str | os.PathLike[str], data: object, *, expected: str, fix: str) -> str | None:
    """``"<path> is <kind>, not <expected>; <fix>"`` when ``data`` is another kind of gemtwin file."""
    kind = file_kind(data)
    if kind is None or kind.startswith(expected):
        return None
    return f"{path} is {kind}, not {expected}; {fix}"


MAX_DEPTH = 32  # nesting levels a gemtwin file may have (a scenario needs fewer than 10)


def read_yaml(path: str | os.PathLike[str], *, label: str | None = None) -> object:
    """Parse a YAML (or JSON) file; ``ValueError`` in one line for anything unreadable.

    Covers bad YAML (its first line and position), bytes that are not UTF-8, and documents
    nested deeper than ``MAX_DEPTH`` (a 5,000-deep ``[[[...`` would otherwise end in a
    ``RecursionError`` inside the parser). ``label`` starts each message (default: the path).
    """
    import yaml

    p = Path(path)
    label = label or str(p)
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{label} is not UTF-8 text; give a YAML file") from None
    try:
        data = yaml.safe_load(text)
    except RecursionError:
        raise ValueError(_too_deep(label)) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f": line {mark.line + 1}" if mark else ""
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{label}{where} is not valid YAML ({first})") from None
    check_depth(data, label)
    return data


def read_json(path: str | os.PathLike[str], *, label: str | None = None) -> object:
    """Parse a JSON file; ``ValueError`` in one line for bad JSON or too deep a document."""
    import json

    p = Path(path)
    label = label or str(p)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except RecursionError:
        raise ValueError(_too_deep(label)) from None
    except UnicodeDecodeError:
        raise ValueError(f"{label} is not UTF-8 text; give a JSON file") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{label} is not JSON ({e.msg} at line {e.lineno})") from None
    check_depth(data, label)
    return data


def check_depth(data: object, label: str) -> None:
    """``ValueError`` when ``data`` nests more than ``MAX_DEPTH`` levels (checked without recursion)."""
    stack = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ValueError(_too_deep(label))
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))


def _too_deep(label: str) -> str:
    return (f"{label} nests lists or mappings more than {MAX_DEPTH} levels deep; gemtwin files "
            "are a few levels deep: check the file")
