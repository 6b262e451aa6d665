"""Load a Scenario from YAML: bundled names, ``extends:`` chains, ``--set a.b=c`` overrides
(or the Python API's ``{"a.b": c}``: both go through ``set_field``).

Every failure is a ``ScenarioError`` whose message is one line: the dotted path, the value and
the fix. The CLI prints it and exits 2.
"""

from __future__ import annotations

import copy
import difflib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Union

import yaml
from pydantic import BaseModel, ValidationError

from scenarios.files import check_depth, read_yaml, wrong_kind
from scenarios.messages import short
from scenarios.schema import DLRMModel, GEMModel, Scenario

LIBRARY = Path(__file__).parent / "library"
# What names a scenario: a bundled name or a YAML path, a mapping in the YAML's shape, or a Scenario.
ScenarioRef = Union[str, "os.PathLike[str]", Mapping[str, Any], Scenario]
# Field overrides: {"training.micro_batch": 512} (Python), or ["training.micro_batch=512"] (--set).
Overrides = Union[Mapping[str, Any], Iterable[str]]
DEFAULT_SCENARIO = "gem-h200-1gpu"


class ScenarioError(ValueError):
    """A scenario that cannot be loaded; the message is one line and says how to fix it."""


def bundled() -> list[str]:
    """Names of the scenarios shipped in ``scenarios/library``."""
    return sorted(p.stem for p in LIBRARY.glob("*.yaml"))


def resolve_path(ref: str, *, relative_to: Path | None = None) -> Path:
    """A bundled name or a path (relative to the extending file, then the cwd)."""
    candidates = []
    if relative_to is not None:
        candidates.append(relative_to / ref)
    candidates += [Path(ref), LIBRARY / f"{ref}.yaml"]
    for c in candidates:
        if c.is_file():
            return c
    raise ScenarioError(
        f"scenario '{ref}' not found: not a file and not a bundled scenario "
        f"(bundled: {', '.join(bundled())})"
    )


def read_raw(ref: str, *, relative_to: Path | None = None, _seen: tuple = ()) -> dict:
    """The merged mapping of a scenario file and everything it ``extends``."""
    path = resolve_path(ref, relative_to=relative_to).resolve()
    if path in _seen:
        raise ScenarioError(f"extends: cycle through {path.name}; remove one extends")
    try:
        data = read_yaml(path, label=path.name) or {}
    except ValueError as e:
        raise ScenarioError(str(e)) from None
    return _with_base(data, path.name, relative_to=path.parent, _seen=_seen + (path,))


def _with_base(data: object, label: str, *, relative_to: Path | None, _seen: tuple = ()) -> dict:
    """``data`` (a scenario mapping named ``label``) merged on top of the scenario it ``extends``,
    found relative to ``relative_to`` (then the cwd and the bundled library)."""
    if not isinstance(data, dict):
        raise ScenarioError(f"{label}: top level must be a mapping, got {type(data).__name__}")
    other = wrong_kind(label, data, expected="a scenario",
                       fix="give a scenario YAML (gemtwin scenarios lists the bundled ones)")
    if other:
        raise ScenarioError(other)
    data = dict(data)
    base_ref = data.pop("extends", None)
    if base_ref is None:
        return data
    if not isinstance(base_ref, str) or not base_ref.strip():
        raise ScenarioError(f"{label}: extends: {short(base_ref)} must be a scenario name or path")
    try:
        base_path = resolve_path(base_ref, relative_to=relative_to)
    except ScenarioError as e:
        raise ScenarioError(f"{label}: extends: {e}{_did_you_mean(base_ref)}") from None
    base = read_raw(str(base_path), relative_to=relative_to, _seen=_seen)
    return deep_merge(base, data)


def raw(ref: ScenarioRef) -> dict:
    """The mapping a scenario reference stands for, ``extends:`` resolved, before validation.

    ``ref``: a bundled name or a YAML path (``str`` or ``Path``), a mapping in the YAML's shape
    (its ``extends:`` found from the cwd or the bundled library), or a ``Scenario`` (its fields).
    """
    if isinstance(ref, Scenario):
        return ref.model_dump(mode="json")
    if isinstance(ref, Mapping):
        try:
            check_depth(dict(ref), "the scenario mapping")
        except ValueError as e:
            raise ScenarioError(str(e)) from None
        return _with_base(copy.deepcopy(dict(ref)), "the scenario mapping", relative_to=None)
    if isinstance(ref, (str, os.PathLike)):
        return read_raw(os.fspath(ref))
    raise ScenarioError(f"scenario {short(ref)} must be a bundled name, a YAML path, a mapping or a "
                        "Scenario (gemtwin scenarios lists the bundled ones)")


def _did_you_mean(ref: str) -> str:
    close = difflib.get_close_matches(ref, bundled(), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def deep_merge(base: dict, override: dict) -> dict:
    """``override`` on top of ``base``: mappings merge key by key, everything else replaces."""
    out = copy.deepcopy(base)
    for k, v in override.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def apply_set(data: dict, assignment: str) -> dict:
    """Apply one ``a.b.c=value`` (value parsed as YAML; list items by index: ``a.0.b=1``)."""
    if not isinstance(assignment, str) or "=" not in assignment:
        raise ScenarioError(f"--set {short(assignment)} must look like path.to.field=value")
    path, text = assignment.split("=", 1)
    return set_field(data, path.strip(), text)


def apply_overrides(data: dict, overrides: Overrides = ()) -> dict:
    """``data`` with every override applied in order: a mapping ``{"training.micro_batch": 512}``
    (the Python API's form) or ``--set`` strings ``["training.micro_batch=512"]`` (the CLI's).
    Both reach ``set_field``, so a key and a value mean the same thing in either form."""
    if isinstance(overrides, Mapping):
        for path, value in overrides.items():
            if not isinstance(path, str) or not path.strip():
                raise ScenarioError(f"override key {short(path)} must be a dotted field path such as "
                                    "training.micro_batch")
            data = set_field(data, path.strip(), value, label="override")
        return data
    if isinstance(overrides, (str, bytes)):
        raise ScenarioError(f"overrides {short(overrides)} must be a mapping such as "
                            "{'training.micro_batch': 512} or a list of 'field=value' strings")
    for assignment in overrides:
        data = apply_set(data, assignment)
    return data


def parse_value(text: str, *, where: str = "--set") -> Any:
    """A ``--set`` right-hand side as YAML (``512`` -> 512, ``{a: row}`` -> a dict); text YAML
    cannot read stays the string it is."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    except RecursionError:
        raise ScenarioError(f"{where}: the value nests too deep to read; check it") from None


def value_text(value: Any) -> str:
    """The ``--set`` right-hand side that ``parse_value`` reads back as ``value``: a string is
    already one (YAML text), anything else is written as flow YAML (``1e-20`` -> ``1.0e-20``)."""
    if isinstance(value, str):
        return value
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 30).strip()
    return text.removesuffix("...").strip()


def set_field(data: dict, path: str, value: Any, *, label: str = "--set") -> dict:
    """A copy of ``data`` with the field at dotted ``path`` set to ``value``; list items by index
    (``a.0.b``). A string value is read as YAML, as on the command line (``"{a: row}"`` is a
    mapping; quote it, ``"'123'"``, to keep a string YAML would read otherwise)."""
    where = f"{label} {path}"
    if isinstance(value, str):
        value = parse_value(value, where=where)
    try:
        check_depth(value, where)
    except ValueError as e:
        raise ScenarioError(str(e)) from None
    keys = path.split(".")
    out = copy.deepcopy(data)
    node: Any = out
    for i, key in enumerate(keys[:-1]):
        node = _step(node, key, ".".join(keys[: i + 1]), create=True, label=label)
    last = keys[-1]
    if isinstance(node, list):
        node[_index(node, last, path, label=label)] = value
    elif isinstance(node, dict):
        node[last] = value
    else:
        raise ScenarioError(f"{label}: {'.'.join(keys[:-1])} is not a section (it is {short(node)})")
    return out


def _step(node: Any, key: str, where: str, *, create: bool, label: str = "--set") -> Any:
    if isinstance(node, list):
        return node[_index(node, key, where, label=label)]
    if not isinstance(node, dict):
        raise ScenarioError(f"{label}: {where} is not a section (it is {short(node)})")
    if key not in node and create:
        node[key] = {}
    return node[key]


def _index(node: list, key: str, where: str, *, label: str = "--set") -> int:
    if not key.isdigit() or int(key) >= len(node):
        raise ScenarioError(f"{label}: {where} needs a list index in 0..{len(node) - 1}, got '{key}'")
    return int(key)


def load(ref: ScenarioRef, overrides: Overrides = ()) -> Scenario:
    """Load a scenario and validate it: the one loader of the CLI and the Python API.

    ``ref``: a bundled name (``gemtwin scenarios``), a YAML path, a mapping in the YAML's shape, or
    a ``Scenario``. ``overrides``: ``{"training.micro_batch": 512}``, or the CLI's ``--set``
    strings ``["training.micro_batch=512"]``; applied in order (``apply_overrides``). Any problem
    is a ``ScenarioError`` whose message is one line: the field, the value and the fix.
    """
    return validate(apply_overrides(raw(ref), overrides))


def validate(data: dict) -> Scenario:
    try:
        return Scenario.model_validate(data)
    except ValidationError as e:
        raise ScenarioError(format_error(e)) from None


def format_error(e: ValidationError) -> str:
    """The first error of ``e`` as one line: dotted path, value, what to do."""
    errors = e.errors(include_url=False)
    err = max(errors, key=lambda x: len(_clean_loc(x["loc"])))  # the deepest union branch
    loc = _clean_loc(err["loc"])
    path = ".".join(loc)
    if err["type"] == "extra_forbidden":
        known = _known_fields(tuple(x for x in err["loc"][:-1] if "[" not in str(x)))
        return f"{path}: unknown field; known fields here: {', '.join(known)}"
    if err["type"] == "union_tag_invalid":
        ctx = err.get("ctx", {})
        return (f"{path}.{ctx.get('discriminator', 'kind').strip(chr(39))}: unknown kind "
                f"{ctx.get('tag')!r}; use one of: {ctx.get('expected_tags')}")
    if err["type"] == "missing":
        return f"{path}: required field is missing; add it"
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "value_error":
        return f"{path}: {msg}" if path else msg
    auto = _or_auto(errors, loc) if err["type"] != "literal_error" else ""
    return f"{path}: {msg[0].lower()}{msg[1:]}{auto} (got {short(err.get('input'))})"


_UNION_BRANCHES = ("gem", "dlrm", "bool", "int", "float", "str", "constrained-int", "constrained-float")


def _clean_loc(loc: tuple) -> list[str]:
    """The dotted path without union-branch labels (``gem``, ``bool``, ``literal['auto']``, ``dict[...]``)."""
    return [str(x) for x in loc if x not in _UNION_BRANCHES and "[" not in str(x)]


def _or_auto(errors: list, loc: list[str]) -> str:
    """`` or 'auto'`` when the field also takes 'auto' (an ``X | Literal["auto"]`` union)."""
    auto = any(_clean_loc(x["loc"]) == loc and x["type"] == "literal_error" and "'auto'" in str(x.get("ctx"))
               for x in errors)
    return ", or 'auto'" if auto else ""


def _known_fields(loc: tuple) -> list[str]:
    """Field names of the section at ``loc`` (walking nested models, lists, and the model union)."""
    cls: type[BaseModel] | None = Scenario
    for part in loc:
        if cls is None:
            break
        if part in ("gem", "dlrm"):
            cls = GEMModel if part == "gem" else DLRMModel
            continue
        if isinstance(part, int):
            continue
        cls = _field_model(cls, str(part))
    return sorted(cls.model_fields) if cls else []


def _field_model(cls: type[BaseModel], name: str) -> type[BaseModel] | None:
    field = cls.model_fields.get(name)
    if field is None:
        return None
    ann = field.annotation
    for arg in (ann, *getattr(ann, "__args__", ())):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
        for inner in getattr(arg, "__args__", ()):
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                return inner
    return None
