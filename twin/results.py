"""Results as the tables people analyse: plain dicts, JSON, and pandas DataFrames.

    d = to_dict(result)              # SimResult, SweepResult, PlanResult, ForecastResult, RunRow
    text = to_json(result)           # json.dumps(to_dict(result)); with a path, also written (atomic)
    again = from_dict(type(result), json.loads(text))   # == result
    df = to_frame(result)            # pandas, the ``frames`` extra

The dict is what JSON can hold and nothing else: pydantic results through ``model_dump``,
dataclass results through pydantic's ``TypeAdapter`` (nested scenarios and SimResults included),
paths as strings, tuples as lists, and no infinity or NaN: a non-finite number becomes ``None``
(a forecast row whose target is out of reach has no step time), which ``from_dict`` turns back
into infinity where the field holds one. ``from_dict`` validates through the same adapters, so a
field that does not fit gets pydantic's error, in one line.

Torch-free; pandas is imported only by ``to_frame``.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Mapping
from dataclasses import asdict, is_dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError

from scenarios.messages import short

if TYPE_CHECKING:
    import pandas

T = TypeVar("T")


# ---- dicts and JSON ---------------------------------------------------------------------------
def to_dict(result: Any) -> dict[str, Any]:
    """``result`` as plain JSON data (module docstring): a pydantic model or a dataclass."""
    if isinstance(result, BaseModel):
        data = result.model_dump(mode="json")
    elif is_dataclass(result) and not isinstance(result, type):
        data = _adapter(type(result)).dump_python(result, mode="json")
    else:
        raise TypeError(f"to_dict takes a result (SimResult, SweepResult, PlanResult, ForecastResult, "
                        f"RunRow, ...), not {type(result).__name__}")  # fmt: skip
    return _finite(data)


def to_json(result: Any, path: str | os.PathLike[str] | None = None) -> str:
    """``to_dict(result)`` as JSON text; with ``path``, also written there atomically."""
    text = json.dumps(to_dict(result), indent=1, allow_nan=False) + "\n"
    if path is not None:
        from scenarios.files import write_text_atomic

        write_text_atomic(path, text)
    return text


def from_dict(cls: type[T], data: Mapping[str, Any]) -> T:
    """The ``cls`` result that ``to_dict`` (or ``to_json`` then ``json.loads``) gave ``data``."""
    if not isinstance(data, Mapping):
        raise ValueError(f"from_dict needs the mapping to_dict gave, not {short(data)}")
    fc = sys.modules.get("twin.forecast")
    if fc is not None and cls is fc.ForecastResult:  # an out-of-reach row's step time: null -> inf
        data = {**data, "rows": [{**r, "step_time_s": math.inf if r.get("step_time_s") is None
                                  else r["step_time_s"]} for r in data.get("rows", [])]}  # fmt: skip
    try:
        if isinstance(cls, type) and issubclass(cls, BaseModel):
            return cls.model_validate(data)
        return _adapter(cls).validate_python(data)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        where = ".".join(str(x) for x in err["loc"])
        raise ValueError(f"{cls.__name__} from a dict: {where}: {err['msg']} (got {short(err.get('input'))}); "
                         f"give the dict to_dict made") from None  # fmt: skip


@lru_cache(maxsize=None)
def _adapter(cls: type) -> TypeAdapter:
    return TypeAdapter(cls)


def _finite(x: Any) -> Any:
    """``x`` with every non-finite float replaced by None (JSON has no infinity or NaN)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return x


# ---- DataFrames -------------------------------------------------------------------------------
def to_frame(result: Any) -> pandas.DataFrame:
    """``result`` as a ``pandas.DataFrame``, one row per:

    - ``SweepResult``: grid point (the swept fields, the metrics, ``error``; invalid points kept);
    - ``ForecastResult``: year and GPU generation (``ForecastRow``'s fields);
    - ``PlanResult``: configuration of the top list, best first (the layout's fields, ``label``,
      samples/s, effective samples/s, MFU, step, exposed communication, memory, lower bound);
    - ``SimResult``, or a list of them: result (its numbers, each dict field spread over columns
      such as ``breakdown_s.compute``; the scenario and calibration it carries left out);
    - a list of ``RunRow`` (``validate``): run (measured and twin step, error, memory error).

    Needs pandas (the ``frames`` extra).
    """
    from twin.forecast import ForecastResult
    from twin.planner import PlanResult
    from twin.simulate import SimResult
    from twin.sweep import SweepResult
    from twin.validate import RunRow

    pd = _pandas()
    if isinstance(result, SweepResult):
        return pd.DataFrame(result.rows, columns=result.columns)
    if isinstance(result, ForecastResult):
        return pd.DataFrame([asdict(r) for r in result.rows])
    if isinstance(result, PlanResult):
        return pd.DataFrame([_plan_row(e) for e in result.top])
    items = [result] if isinstance(result, SimResult) else result
    if isinstance(items, list) and items and all(isinstance(x, SimResult) for x in items):
        return pd.DataFrame([_sim_row(r) for r in items])
    if isinstance(items, list) and items and all(isinstance(x, RunRow) for x in items):
        return pd.DataFrame([_run_row(r) for r in items])
    raise TypeError(f"to_frame takes a SweepResult, ForecastResult, PlanResult, SimResult (or a list of "
                    f"them) or validate's list of RunRow, not {short(result)}")  # fmt: skip


_SIM_SKIPPED = ("resolved_scenario", "calibration_content", "rank_classes", "execution_priced",
                "execution_not_priced")  # fmt: skip


def _sim_row(r) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for k, v in r.model_dump(mode="python", exclude=set(_SIM_SKIPPED)).items():
        if isinstance(v, dict):
            row.update({f"{k}.{kk}": vv for kk, vv in v.items() if not isinstance(vv, (dict, list))})
        else:
            row[k] = v
    return row


def _plan_row(e) -> dict[str, Any]:  # e: a PlanEntry
    from twin.planner import effective_samples_per_s

    r = e.result
    return {**asdict(e.candidate), "label": e.candidate.label(), "samples_per_s": r.samples_per_s,
            "effective_samples_per_s": effective_samples_per_s(r), "mfu": r.mfu,
            "step_time_s": r.step_time_s, "exposed_comm_s": r.breakdown_s["exposed_comm"],
            "straggler_s": r.straggler_s, "memory_total_bytes": r.memory_total_bytes,
            "memory_fits": r.memory_fits, "bound_s": e.bound_s}  # fmt: skip


def _run_row(r) -> dict[str, Any]:
    return {"run_id": r.run_id, "scenario": r.scenario, "source": r.source, "held_out": r.held_out,
            "measured_step_s": r.measured_step_s, "twin_step_s": r.twin_step_s, "error": r.error,
            "memory_error": r.memory_error}  # fmt: skip


def _pandas():
    try:
        import pandas
    except ImportError:
        from twin.console import install_hint

        raise ImportError(f"to_frame needs pandas, which is not installed; install it with: "
                          f"{install_hint('frames')}") from None  # fmt: skip
    return pandas


__all__ = ["from_dict", "to_dict", "to_frame", "to_json"]
