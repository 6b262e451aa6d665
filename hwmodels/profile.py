"""Hardware profiles written by ``gemtwin hw probe``: the machine it ran on, as the twin's hardware.

A profile is a YAML file holding one GPU-catalog entry (``gpus:``, the shape of gpus.yaml) and one
network preset (``presets:``, the shape of networks.yaml), each number with its ``source:``, plus
the raw measurements they were fitted from. A scenario names it as its hardware with the prefix
``probe:`` in both fields::

    hardware: {gpu: "probe:/tmp/probe.yaml", network: "probe:/tmp/probe.yaml", num_gpus: 1}
    gemtwin simulate debug-cpu --set hardware.gpu=probe:/tmp/probe.yaml

``get_gpu`` / ``get_network`` resolve such names here, so every caller that asks the catalog gets
the profile. The entry's ``base:`` (``cpu``) is the bundled entry it stands in for: its efficiency
curves (efficiency.yaml family), the calibrations that apply to it and the storage/failure
defaults; the profile replaces the peaks and bandwidths those curves multiply.

Collectives: each measured kind is fitted by least squares to ``t(m) = alpha + m / beta``
(``fit_alpha_beta``; ``m`` = msg_bytes in the nccl-tests convention of hwmodels/collectives.py), and
the preset's one tier reproduces that line exactly: ``kind_latency_s`` = alpha, ``bw_per_gpu_Bps`` =
the best bus rate (beta x bus factor) and ``kind_efficiency`` = each kind's bus rate over it.
Torch-free: the measuring half is hwmodels/bench/probe.py.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NamedTuple, Sequence

from pydantic import ValidationError

PROBE_PREFIX = "probe:"
PROFILE_KIND = "gemtwin hw probe profile"
ENTRY = "probe"  # the key of the profile's one gpus: entry and one presets: entry
MEASURED_KINDS = ("all_reduce", "all_to_all")
_CACHE: dict[tuple[str, int, int], tuple[Any, Any]] = {}


class AlphaBeta(NamedTuple):
    """``t(m) = alpha_s + m / beta_Bps`` and the worst relative residual of the fit."""

    alpha_s: float
    beta_Bps: float
    max_rel_err: float


def fit_alpha_beta(rows: Sequence[tuple[float, float]]) -> AlphaBeta:
    """Least squares of ``t = alpha + m / beta`` to ``(msg_bytes, time_s)`` rows, on relative residuals
    (each row weighted 1/t, so the small messages fix alpha and the large ones beta). alpha is kept >= 0;
    ValueError for fewer than 2 sizes or times that do not grow with the size."""
    pts = [(float(m), float(t)) for m, t in rows if t > 0]
    if len({m for m, _ in pts}) < 2:
        raise ValueError(f"fit_alpha_beta: need rows at 2 or more message sizes, got {len(pts)}")
    # normal equations of min sum((alpha/t + x m/t - 1)^2), x = 1/beta
    saa = sum(1 / t**2 for _, t in pts)
    sax = sum(m / t**2 for m, t in pts)
    sxx = sum(m * m / t**2 for m, t in pts)
    sa1, sx1 = sum(1 / t for _, t in pts), sum(m / t for m, t in pts)
    det = saa * sxx - sax * sax
    alpha, x = (sa1 * sxx - sx1 * sax) / det, (saa * sx1 - sax * sa1) / det
    if alpha < 0:  # no latency: the best line through the origin
        alpha, x = 0.0, sx1 / sxx
    if x <= 0:
        raise ValueError("fit_alpha_beta: the times do not grow with the message size; measure larger messages")
    err = max(abs(alpha + m * x - t) / t for m, t in pts)
    return AlphaBeta(alpha, 1.0 / x, err)


# ---- writing ---------------------------------------------------------------------------------------
def _bus_factor(kind: str, n: int) -> float:
    from hwmodels.collectives import bus_factor

    return bus_factor(kind, n)


def network_tier(fits: dict[str, AlphaBeta], *, ranks: int, source: str) -> dict[str, Any]:
    """A networks.yaml tier (a dict) that prices every fitted kind exactly as ``alpha + m / beta``.

    Kinds not measured (all_gather, reduce_scatter, broadcast, send_recv) take all_reduce's
    efficiency and a ring step of half its alpha (as the bundled cpu-host tier assumes)."""
    bus = {k: f.beta_Bps * _bus_factor(k, ranks) for k, f in fits.items()}
    bw = max(bus.values())
    ref = "all_reduce" if "all_reduce" in fits else next(iter(fits))
    return {"name": "host", "fabric": "host", "domain_gpus": ranks, "bw_per_gpu_Bps": bw,
            "latency_s": fits[ref].alpha_s / 2, "efficiency": bus[ref] / bw, "half_eff_bytes": 0.0,
            "kind_latency_s": {k: f.alpha_s for k, f in fits.items()},
            "kind_efficiency": {k: bus[k] / bw for k in fits}, "sources": [ENTRY]}


def build_profile(meas: dict[str, Any], *, base: dict[str, Any], base_name: str = "cpu") -> dict[str, Any]:
    """The profile document from ``meas`` (hwmodels/bench/probe.py ``measure``): gemm rows, copy rows,
    collective rows per kind, env. ``base``: the bundled gpus.yaml entry it stands in for (its TDP,
    which nothing here measures). Rates are medians over each case's repeats."""
    env = meas["env"]
    said = f"measured by gemtwin hw probe on {env['host']} at {env['time_utc']}"
    src = lambda note: {"source": ENTRY, "note": note}  # noqa: E731
    peaks = {}
    for dt in ("fp32", "bf16"):
        rows = [r for r in meas["gemm"] if r["dtype"] == dt]
        if rows:
            best = max(rows, key=lambda r: r["flops_per_s"])
            peaks[dt] = {"value": best["flops_per_s"], **src(f"torch.mm {dt}: the best median rate over "
                                                              f"{len(rows)} sizes ({best['m']}^3)")}
    dram = [r for r in meas["copy"] if r["bytes"] >= 2 * 64 * 2**20] or meas["copy"]
    bw = max(dram, key=lambda r: r["Bps"])
    fits = {k: fit_alpha_beta([(r["msg_bytes"], r["median_s"]) for r in rows])
            for k, rows in meas["collectives"].items()}
    ranks = meas["ranks"]
    tier = network_tier(fits, ranks=ranks, source=ENTRY)
    gpu = {"description": f"{env['host']}: {env.get('cpu_model', 'CPU')}, {env['cores']} cores, torch "
                          f"{env['torch']} at {env['threads']} threads (gemtwin hw probe)",
           "base": base_name, "peak_flops": peaks,
           "hbm_bytes": {"value": env["mem_total_bytes"], **src("host RAM (/proc/meminfo MemTotal)")},
           "hbm_bw_Bps": {"value": bw["Bps"], **src(f"copy_ of {bw['bytes'] // 2 >> 20} MiB fp32, bytes read + "
                                                   "written (median)")},
           "sms": {"value": env["cores"], **src("cores (os.cpu_count())")},
           "nvlink_bw_Bps": {"value": tier["bw_per_gpu_Bps"], **src("no NVLink: the best gloo bus rate between "
                                                                    f"{ranks} local processes (the preset's bw)")},
           "tdp_w": {"value": base["tdp_w"]["value"], "source": "assumption",
                     "note": f"not measured: the {base_name} entry's (gpus.yaml)"}}
    preset = {"description": f"{ranks} CPU ranks (processes) of {env['host']} over gloo, alpha/beta fitted "
                             "by gemtwin hw probe", "tiers": [tier]}
    return {"kind": PROFILE_KIND, "version": 1, "measured": said,
            "references": {ENTRY: said, "assumption": "assumption, not measured"},
            "gpus": {ENTRY: gpu}, "presets": {ENTRY: preset},
            "fits": {k: {"alpha_s": f.alpha_s, "beta_Bps": f.beta_Bps,
                         "bus_Bps": f.beta_Bps * _bus_factor(k, ranks), "max_rel_err": f.max_rel_err}
                     for k, f in fits.items()},
            "measurements": meas}


# ---- reading ---------------------------------------------------------------------------------------
def _read(path: Path, field: str) -> dict[str, Any]:
    from scenarios.files import read_yaml, wrong_kind

    fix = f"write one with `gemtwin hw probe -o {path}` or fix the path"
    if not path.is_file():
        raise ValueError(f"profile file {str(path)!r} not found ({field} {PROBE_PREFIX}{path}); {fix}")
    raw = read_yaml(path, label=f"profile file {str(path)!r}")
    other = wrong_kind(path, raw, expected="a hardware profile", fix=f"give {field} a file from gemtwin hw probe -o")
    if other:
        raise ValueError(other)
    if not isinstance(raw, dict) or raw.get("kind") != PROFILE_KIND:
        raise ValueError(f"profile file {str(path)!r} is not a gemtwin hw probe profile (no `kind: {PROFILE_KIND}`); "
                         f"{fix}")
    return raw


def _one_line(err: ValidationError, where: str) -> ValueError:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"]) or "(top level)"
    return ValueError(f"{where}: {loc} = {str(first.get('input'))[:60]}: {first['msg']}")


def load_profile(path: str | os.PathLike[str], *, field: str = "hardware.gpu") -> tuple[Any, Any]:
    """(GPUSpec, NetworkPreset) of a profile, both named ``probe:<path>``; read once per file version.
    One-line ValueError (naming ``field`` and the fix) for a missing, unreadable or invalid file."""
    from hwmodels.gpus import _spec
    from hwmodels.network import NetworkPreset

    p = Path(path)
    try:
        st = p.stat()
        key = (str(p.resolve()), st.st_mtime_ns, st.st_size)
    except OSError:
        key = None
    if key in _CACHE:
        return _CACHE[key]
    raw = _read(p, field)
    name = f"{PROBE_PREFIX}{path}"
    where = f"profile file {str(p)!r}"
    refs = {k: f"{p}: {v}" for k, v in (raw.get("references") or {}).items()}
    try:
        gpu = _spec(name, raw["gpus"][ENTRY], refs)
        net_raw = raw["presets"][ENTRY]
        used = {s for t in net_raw["tiers"] for s in t["sources"]}
        net = NetworkPreset(name=name, **net_raw, sources={k: refs.get(k, "") for k in sorted(used)})
    except (KeyError, TypeError) as e:
        raise ValueError(f"{where}: missing {e} (gpus.{ENTRY} and presets.{ENTRY} are required); "
                         f"write it again with `gemtwin hw probe -o {p}`") from None
    except ValidationError as e:
        raise _one_line(e, where) from None
    if len(_CACHE) > 64:
        _CACHE.clear()
    _CACHE[key] = (gpu, net)
    return gpu, net


def is_probe(name: str) -> bool:
    return name.startswith(PROBE_PREFIX)


def probe_path(name: str) -> str:
    """``probe:PATH`` -> PATH; ValueError when PATH is empty."""
    path = name[len(PROBE_PREFIX):]
    if not path:
        raise ValueError(f"{name!r} names no file; write probe:PATH (a file from gemtwin hw probe -o PATH)")
    return path
