"""Roofline kernel cost: max(compute time, memory time) + launch, per op class or per kernel kind.

Two ways in. The OLD call, per op class with flat efficiencies (`DEFAULT_EFFICIENCY`):

    compute_s = flops / (peak(dtype) × eff_compute)      memory_s = bytes / (hbm_bw_Bps × eff_memory)
    time_s    = (max(compute_s, memory_s) + launch_s) × scale[op_class]

`gemm` and `attention` run on tensor cores at `peak(dtype)`; the other classes run on CUDA
cores, so their compute roof is the fp32 (non-tensor) peak whatever `dtype` says. `scale`
is a calibration's per-class multiplier (`calibration.Calibration.scale`), 1 when absent.

The NEW call, per kernel kind (`KERNEL_KINDS`, finer than the op class) with size-dependent
efficiency curves read from `data/efficiency.yaml` (per GPU family; every number sourced):

    eff(x) = eff_max · x / (x + x_half)        x = the call's FLOPs (compute) or bytes (memory)
    compute_s = (flops + x_half_flops) / (peak(dtype) · eff_max_c)      (0 when flops == 0)
    memory_s  = (bytes + x_half_bytes) / (hbm_bw_Bps · eff_max_m)       (0 when bytes == 0)
    time_s    = (max(compute_s, memory_s) + launch_s) × scale

`kernel_cost(kind=...)` looks its parameters up in a dict keyed (gpu, kind, dtype), filled on
first use, so one query is a few µs. A calibration may replace curves (`KernelModel(overrides)`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from hwmodels._data import load_yaml
from hwmodels.gpus import GPUSpec, get_gpu
from scenarios.vocab import OP_CLASSES, TENSOR_CORE_CLASSES, AttentionKind, Direction, KernelKind, OpClass, kernel_kind

# (compute efficiency, memory efficiency) per op class: the fraction of the datasheet roof a
# good kernel reaches. Measured on one H200 (hwmodels/data/measured/h200_2026-11-30.yaml)
# against the datasheet 989 TFLOP/s bf16 and 4.8 TB/s, unless marked as an assumption.
DEFAULT_EFFICIENCY: dict[str, tuple[float, float]] = {
    # bf16 matmul 8192^3: 780 / 989 = 0.79; fp8 row-wise 1,341 / 1,979 = 0.68 (bf16 taken).
    # Memory side: copy 4.25 / 4.8 = 0.885, rounded down (GEMM epilogues stream less well).
    "gemm": (0.79, 0.80),
    # SDPA bf16 fwd+bwd at S=4096: 546 / 989 = 0.55 (fwd alone 0.66; S=1024 fwd+bwd 0.33).
    "attention": (0.55, 0.80),
    # F.embedding_bag sum fwd, rows read: fp32 1.72 / 4.8 = 0.36, bf16 1.02 / 4.8 = 0.21
    # (FBGEMM TBE reaches ~2.5 TB/s fwd, ANCHORS.md). Compute side: assumption, never binding.
    "embedding": (0.50, 0.35),
    # device copy 4.25 / 4.8 = 0.885. Compute side: assumption (CUDA-core fp32).
    "elementwise": (0.50, 0.885),
    # assumption: reductions over a row stream ~15% below a copy.
    "norm": (0.50, 0.75),
    # assumption: MXFP8 quantization target >= 3.4 TB/s (ANCHORS.md targets) / 4.8 = 0.71.
    "quantize": (0.50, 0.70),
    # assumption: fused multi-tensor Adam streams params, grads and two moments near copy speed.
    "optimizer": (0.50, 0.80),
    # assumption: unknown kernels get half of each roof.
    "other": (0.50, 0.50),
}


@dataclass(frozen=True, slots=True)
class KernelCost:
    """Roofline breakdown of one kernel (scale already applied to each part)."""

    compute_s: float
    memory_s: float
    launch_s: float
    op_class: str = "other"
    kind: str = ""

    @property
    def bound(self) -> Literal["compute", "memory"]:
        return "compute" if self.compute_s >= self.memory_s else "memory"

    @property
    def time_s(self) -> float:
        return max(self.compute_s, self.memory_s) + self.launch_s


def check_op_class(op_class: str) -> None:
    """One-line ValueError unless `op_class` is one of OP_CLASSES."""
    if op_class not in OP_CLASSES:
        raise ValueError(f"unknown op_class {op_class!r}; known: {', '.join(OP_CLASSES)}")


# Kernel kind -> op class (the class is what breakdowns and calibration scales use).
KERNEL_KINDS: dict[KernelKind, OpClass] = {k: k.op_class for k in KernelKind}
_SIDES = {"compute": "x_half_flops", "memory": "x_half_bytes"}
_CURVE_FIELDS = ("compute_eff_max", "compute_x_half_flops", "memory_eff_max", "memory_x_half_bytes", "launch_s",
                 "x_half_scale")


# Bytes per element of each dtype the cost model prices (MXFP8: an E4M3 byte + an E8M0 scale per 32;
# fp8_block: an E4M3 byte + an fp32 scale per 128); twin/flops.py counts an op's bytes with these.
ELEM_BYTES = {"fp32": 4.0, "bf16": 2.0, "mxfp8": 1.0 + 1.0 / 32, "fp8_block": 1.0 + 4.0 / 128}


def check_kind(kind: str) -> None:
    """One-line ValueError unless `kind` is one of KERNEL_KINDS."""
    if kind not in KERNEL_KINDS:
        raise ValueError(f"unknown kernel kind {kind!r}; known: {', '.join(KERNEL_KINDS)}")


@dataclass(frozen=True, slots=True)
class EfficiencyRow:
    """One side of one kind's curve on one GPU, as `gemtwin hw show` prints it."""

    kind: str
    op_class: str
    dtype: str  # "*" = every dtype without its own entry
    side: Literal["compute", "memory"]
    eff_max: float
    x_half: float  # FLOPs (compute) or bytes (memory)
    x_half_unit: Literal["FLOP", "B"]
    launch_s: float
    source: str
    note: str = ""


def family_name(gpu: str) -> str:
    """The efficiency family `gpu` belongs to (hwmodels/data/efficiency.yaml), '' for none; a probe
    profile (``probe:PATH``) belongs to its base entry's."""
    if gpu.startswith("probe:") or "/" in gpu:  # a probe profile, an entry shared by processes
        gpu = get_gpu(gpu).base
    return next((n for n, f in load_yaml("efficiency.yaml")["families"].items() if gpu in f["gpus"]), "")


def _family_of(gpu: str) -> tuple[str, dict[str, Any]]:
    name = family_name(gpu)
    if name:
        return name, load_yaml("efficiency.yaml")["families"][name]
    raise ValueError(f"GPU {gpu!r} is in no family of hwmodels/data/efficiency.yaml; add it to one's `gpus:` list")


def _kinds_of(fam: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(kinds, launch entry) of a family with its `inherit:` chain resolved (a child's kind replaces the parent's)."""
    if "inherit" not in fam:
        return dict(fam["kinds"]), fam["launch_s"]
    kinds, launch = _kinds_of(load_yaml("efficiency.yaml")["families"][fam["inherit"]])
    return kinds | (fam.get("kinds") or {}), fam.get("launch_s", launch)


def efficiency_table(gpu: str | GPUSpec) -> list[EfficiencyRow]:
    """Every kind's compute and memory curve on `gpu` (dtype overrides as extra rows), sources resolved."""
    name = gpu if isinstance(gpu, str) else gpu.name
    spec = get_gpu(name)
    refs = load_yaml("efficiency.yaml")["references"]
    kinds, launch = _kinds_of(_family_of(spec.name)[1])
    out: list[EfficiencyRow] = []
    for kind, op_class in KERNEL_KINDS.items():
        entry = kinds[kind]
        for dtype, sides in [("*", entry), *sorted((entry.get("dtypes") or {}).items())]:
            for side, x_key in _SIDES.items():
                if side not in sides:
                    continue
                c = sides[side]
                out.append(EfficiencyRow(kind, op_class, dtype, side, c["eff_max"], c[x_key],
                                         ("FLOP" if side == "compute" else "B") + ("/seq" if c.get("x_half_per") == "segment" else ""), launch["value"],
                                         refs.get(c["source"], c["source"]), c.get("note", "")))
    return out


@dataclass(frozen=True, slots=True)
class _Curve:
    """One (gpu, kind, dtype)'s curve, as the hot path reads it: the roofs after efficiency."""

    op_class: OpClass
    rate_flops: float  # FLOP/s at eff_max
    x_half_flops: float
    rate_Bps: float  # B/s at eff_max
    x_half_bytes: float
    launch_s: float
    per_segment: bool  # the x_half are per sequence (times the call's segments)


def _curve_params(gpu: GPUSpec, kind: str, dtype: str, override: Mapping[str, float] | None) -> _Curve:
    """The curve of one (gpu, kind, dtype), a calibration's `override` applied."""
    check_kind(kind)
    fam = _family_of(gpu.name)[1]
    kinds, launch = _kinds_of(fam)
    entry = kinds[kind]
    dtypes = entry.get("dtypes") or {}
    if dtype == "mxfp8" and "mxfp8" not in dtypes:  # no MX curve for this kind on this family: plain
        # fp8's (the upper bound of an emulation; Hopper's gemm has its measured one), or what the
        # family says our MXFP8 attention runs on (Hopper: bf16 MMAs on dequantized operands)
        attention = KernelKind(kind).op_class is OpClass.ATTENTION
        dtype = fam.get("mxfp8_attention_as", "fp8") if attention else "fp8"
        # the kernels then move that dtype's bytes, not the MX ones the op counted
        mem_factor = ELEM_BYTES.get(dtype, ELEM_BYTES["mxfp8"]) / ELEM_BYTES["mxfp8"]
        # and take this much longer than that dtype's kernels (measured; the quantize work inside)
        slowdown = float((fam.get("mxfp8_attention_slowdown") or {}).get(kind, 1.0)) if attention else 1.0
    else:
        mem_factor = slowdown = 1.0
    per_dtype = dtypes.get(dtype, {})
    c, m = per_dtype.get("compute", entry["compute"]), per_dtype.get("memory", entry["memory"])
    v = {"compute_eff_max": c["eff_max"], "compute_x_half_flops": c["x_half_flops"],
         "memory_eff_max": m["eff_max"], "memory_x_half_bytes": m["x_half_bytes"], "launch_s": launch["value"]}
    v |= dict(override or {})
    xh = v.pop("x_half_scale", 1.0)  # a fit across sizes: both sides' x_half (each dtype's) times this
    v["compute_x_half_flops"], v["memory_x_half_bytes"] = xh * v["compute_x_half_flops"], xh * v["memory_x_half_bytes"]
    peak = gpu.peak(dtype if KernelKind(kind).tensor_core else "fp32")
    per_segment = c.get("x_half_per", "call") == "segment"
    return _Curve(KERNEL_KINDS[kind], peak * v["compute_eff_max"] / slowdown, v["compute_x_half_flops"],
                  gpu.hbm_bw_Bps * v["memory_eff_max"] / (mem_factor * slowdown), v["memory_x_half_bytes"],
                  v["launch_s"], per_segment)


class KernelModel:
    """Efficiency curves for every GPU, optionally with a calibration's per-kind overrides.

    `overrides[kind]` may set any of compute_eff_max, compute_x_half_flops, memory_eff_max,
    memory_x_half_bytes, launch_s (for every GPU and dtype this model is asked about), and
    x_half_scale, a multiplier on both sides' x_half of every dtype (what ``twin.calibrate`` fits
    across runs of different sizes, where a replaced value would lose the dtypes' own curves).
    """

    __slots__ = ("_overrides", "_params")

    def __init__(self, overrides: Mapping[str, Mapping[str, float]] | None = None) -> None:
        for kind, fields in (overrides or {}).items():
            check_kind(kind)
            for f, x in fields.items():
                if f not in _CURVE_FIELDS:
                    raise ValueError(f"efficiency override {kind}.{f}: unknown field; use one of {', '.join(_CURVE_FIELDS)}")
                if not (x > 0 if f.endswith("eff_max") else x >= 0) or (f.endswith("eff_max") and x > 1):
                    raise ValueError(f"efficiency override {kind}.{f} = {x!r}: eff_max must be in (0, 1], "
                                     "x_half and launch_s >= 0")
        self._overrides = {k: dict(v) for k, v in (overrides or {}).items()}
        self._params: dict[tuple[str, str, str], _Curve] = {}

    def cost(self, *, kind: str, flops: float, bytes: float, gpu: GPUSpec, dtype: str,
             scale: Mapping[str, float] | None = None, segments: float = 1.0) -> KernelCost:
        """Roofline breakdown of one `kind` call; `scale` (per op class, or per kind, which wins) multiplies it.

        `segments`: independent sequences in the call (attention: samples x heads). A curve marked
        `x_half_per: segment` gives its x_half per sequence, so that its efficiency follows the
        length of the sequences and not the batch size (twice the samples, twice the time)."""
        key = (gpu.name, kind, dtype)
        p = self._params.get(key)
        if p is None:
            p = self._params[key] = _curve_params(gpu, kind, dtype, self._overrides.get(kind))
        xh_c, xh_m = p.x_half_flops, p.x_half_bytes
        if p.per_segment:
            if segments <= 0:
                raise ValueError(f"kernel {kind}: segments ({segments}) must be > 0")
            xh_c, xh_m = xh_c * segments, xh_m * segments
        if flops < 0 or bytes < 0:
            raise ValueError(f"kernel {kind}: flops ({flops}) and bytes ({bytes}) must be >= 0")
        s = 1.0 if scale is None else scale.get(kind, scale.get(p.op_class, 1.0))
        return KernelCost(s * (flops + xh_c) / p.rate_flops if flops > 0 else 0.0,
                          s * (bytes + xh_m) / p.rate_Bps if bytes > 0 else 0.0, s * p.launch_s, p.op_class, kind)


DEFAULT_MODEL = KernelModel()


# ---- table-batched lookups ------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TbeCurve:
    """One GPU's table-batched lookup model (efficiency.yaml ``tbe:``, fitted by hwmodels.bench.fit_tbe):

        forward  = fwd_fixed_s + max(bags · per_bag_s, (ids + bags) · row_bytes / read_Bps)
        backward = bwd_fixed_s + ids · per_id_s + unique_rows · (2 · row_bytes + 8) / update_Bps

    for one fused call over a group of tables (the backward with the row-wise Adagrad update fused
    in). The rates are the family's efficiencies times the GPU's HBM bandwidth."""

    fwd_fixed_s: float
    per_bag_s: float
    read_Bps: float
    bwd_fixed_s: float
    per_id_s: float
    update_Bps: float

    def time_s(self, direction: Direction | str, *, ids: float, bags: float, unique_rows: float,
               row_bytes: float) -> float:
        """Seconds of one fused call moving ``ids`` rows of ``row_bytes`` into ``bags`` bags
        (``unique_rows`` of them distinct: what the backward's update touches)."""
        if min(ids, bags, unique_rows, row_bytes) < 0:
            raise ValueError(f"tbe call: ids ({ids}), bags ({bags}), unique_rows ({unique_rows}) and row_bytes "
                             f"({row_bytes}) must be >= 0")
        if Direction(direction) is Direction.FWD:
            return self.fwd_fixed_s + max(bags * self.per_bag_s, (ids + bags) * row_bytes / self.read_Bps)
        return self.bwd_fixed_s + ids * self.per_id_s + unique_rows * (2 * row_bytes + 8) / self.update_Bps


def tbe_curve(gpu: GPUSpec) -> TbeCurve | None:
    """``gpu``'s table-batched lookup model, or None where its family has none (nothing measured:
    the lookups stay on the embedding.* curves)."""
    fam = _family_of(gpu.name)[1]
    while "tbe" not in fam and "inherit" in fam:
        fam = load_yaml("efficiency.yaml")["families"][fam["inherit"]]
    t = fam.get("tbe")
    if t is None:
        return None
    v = {k: float(e["value"]) for k, e in t.items()}
    return TbeCurve(v["fwd_fixed_s"], v["per_bag_s"], v["read_eff"] * gpu.hbm_bw_Bps, v["bwd_fixed_s"],
                    v["per_id_s"], v["update_eff"] * gpu.hbm_bw_Bps)


def kernel_cost(*, flops: float, bytes: float, gpu: GPUSpec, dtype: str, kind: str | None = None,
                op_class: str | None = None, efficiency: Mapping[str, tuple[float, float]] | None = None,
                scale: Mapping[str, float] | None = None, launch_s: float = 5e-6,
                model: KernelModel | None = None, segments: float = 1.0) -> KernelCost:
    """Roofline breakdown of one kernel.

    With `kind` (KERNEL_KINDS): the efficiency curves of `model` (default: data/efficiency.yaml);
    `efficiency` and `launch_s` are ignored. With `op_class` only (the old call): flat
    DEFAULT_EFFICIENCY per class, overridden by `efficiency`, plus `launch_s`.
    `scale` multiplies time (per op class; with `kind`, a per-kind entry wins). `segments`: see
    `KernelModel.cost`.
    """
    if kind is not None:
        return (model or DEFAULT_MODEL).cost(kind=kind, flops=flops, bytes=bytes, gpu=gpu, dtype=dtype, scale=scale,
                                             segments=segments)
    if op_class is None:
        raise ValueError("kernel_cost needs kind= (one of KERNEL_KINDS) or op_class= (one of OP_CLASSES)")
    check_op_class(op_class)
    eff_c, eff_m = (efficiency or {}).get(op_class) or DEFAULT_EFFICIENCY[op_class]
    s = (scale or {}).get(op_class, 1.0)
    if min(flops, bytes) < 0 or min(eff_c, eff_m, s) <= 0:
        raise ValueError(f"kernel {op_class}: flops ({flops}) and bytes ({bytes}) must be >= 0, "
                         f"efficiency ({eff_c}, {eff_m}) and scale ({s}) > 0")
    peak = gpu.peak(dtype if op_class in TENSOR_CORE_CLASSES else "fp32")
    return KernelCost(s * flops / (peak * eff_c), s * bytes / (gpu.hbm_bw_Bps * eff_m), s * launch_s, op_class)


def kernel_time_s(*, flops: float, bytes: float, gpu: GPUSpec, dtype: str, kind: str | None = None,
                  op_class: str | None = None, efficiency: Mapping[str, tuple[float, float]] | None = None,
                  scale: Mapping[str, float] | None = None, launch_s: float = 5e-6,
                  model: KernelModel | None = None, segments: float = 1.0) -> float:
    """Seconds for one kernel: (max(compute, memory) + launch) × scale; see `kernel_cost`."""
    if kind is not None:
        return (model or DEFAULT_MODEL).cost(kind=kind, flops=flops, bytes=bytes, gpu=gpu, dtype=dtype,
                                             scale=scale, segments=segments).time_s
    return kernel_cost(op_class=op_class, flops=flops, bytes=bytes, gpu=gpu, dtype=dtype,
                       efficiency=efficiency, scale=scale, launch_s=launch_s).time_s


def memory_curve(gpu: GPUSpec, kind: str, dtype: str = "bf16") -> tuple[float, float]:
    """``(eff_max, x_half_bytes)`` of the memory side of ``kind``'s curve on ``gpu`` (efficiency.yaml,
    no calibration): what a fit or a rule that prices another kernel against this one reads."""
    c = _curve_params(gpu, kind, dtype, None)
    return c.rate_Bps / gpu.hbm_bw_Bps, c.x_half_bytes


@dataclass(frozen=True, slots=True)
class AnchorRow:
    """One measured kernel against the model. `rel_err` = predicted time / measured time - 1."""

    name: str
    source: str
    measured_s: float
    predicted_s: float
    work: float  # FLOPs, or bytes for memory-rated rows
    unit: Literal["TFLOP/s", "TB/s"]
    pinned: bool  # tests hold it within ANCHOR_TOLERANCE

    @property
    def rel_err(self) -> float:
        return self.predicted_s / self.measured_s - 1

    @property
    def measured_rate(self) -> float:
        return self.work / self.measured_s / 1e12

    @property
    def predicted_rate(self) -> float:
        return self.work / self.predicted_s / 1e12


ANCHOR_TOLERANCE = 0.10


def _att_work(b: int, h: int, q: int, kv: int, d: int, causal: bool = False) -> tuple[float, float]:
    """(fwd FLOPs, fwd bytes) of dense bf16 attention as the twin counts them (kernels/attention/cost.py)."""
    return 4.0 * b * h * q * kv * d * (0.5 if causal else 1.0), 2.0 * h * d * 2 * b * (q + kv)


def anchor_table(gpu: str = "h200", model: KernelModel | None = None) -> list[AnchorRow]:
    """Predicted vs measured for the ANCHORS.md ceilings and every row of the newest kernel sweep of `gpu`."""
    from hwmodels.measured import kernel_sweep, measured_ceilings

    spec, m = get_gpu(gpu), model or DEFAULT_MODEL
    t = lambda kind, f, b, dt="bf16": m.cost(kind=kind, flops=f, bytes=b, gpu=spec, dtype=dt).time_s  # noqa: E731
    rows: list[AnchorRow] = []
    mc = measured_ceilings(gpu)
    n = 8192
    for key, dt in (("bf16", "bf16"), ("fp8_tensorwise", "fp8"), ("fp8_rowwise", "fp8")):
        if key in mc.matmul_flops:
            f, b = 2.0 * n**3, (6.0 if dt == "bf16" else 4.0) * n * n
            rows.append(AnchorRow(f"matmul {key} 8192^3", mc.file, f / mc.matmul_flops[key], t("gemm", f, b, dt),
                                  f, "TFLOP/s", True))
    for r in mc.sdpa:
        f, b = _att_work(r.batch, r.heads, r.q_len, r.kv_len, r.head_dim)
        fwd, bwd = _sdpa_kinds(r.q_len == r.kv_len)
        tag = f"B{r.batch} H{r.heads} Q{r.q_len} KV{r.kv_len} D{r.head_dim}"
        t_f = f / r.fwd_flops
        rows.append(AnchorRow(f"sdpa fwd {tag}", mc.file, t_f, t(fwd, f, b), f, "TFLOP/s", True))
        if r.fwd_bwd_flops:
            t_fb = 3.5 * f / r.fwd_bwd_flops  # the measurement counts bwd as 2.5 x fwd FLOPs
            p_b = t(bwd, 2 * f, 2 * b)
            rows.append(AnchorRow(f"sdpa bwd (fwd+bwd - fwd) {tag}", mc.file, t_fb - t_f, p_b, 2 * f, "TFLOP/s", True))
            rows.append(AnchorRow(f"sdpa fwd+bwd {tag}", mc.file, t_fb, rows[-2].predicted_s + p_b, 3.5 * f,
                                  "TFLOP/s", True))
    for r in mc.embedding_bag:
        e = 4.0 if r.dtype == "fp32" else 2.0
        read = r.bags * r.ids_per_bag * r.dim * e
        rows.append(AnchorRow(f"embedding_bag fwd {r.dtype} {r.rows}x{r.dim} {r.bags}x{r.ids_per_bag}", mc.file,
                              read / r.read_Bps, t("embedding.fwd", 0.0, read + r.bags * r.dim * e, r.dtype),
                              read, "TB/s", True))
    big = 2.0 * (1 << 30)  # ANCHORS.md gives no size: taken as a 1 GiB copy (bytes read + written)
    rows.append(AnchorRow("copy 1 GiB (size assumed)", mc.file, big / mc.copy_Bps, t("elementwise", 0.0, big),
                          big, "TB/s", True))
    sweep = kernel_sweep(gpu)
    for r in (sweep or {}).get("rows", []):
        row = _sweep_row(r, t, sweep["file"])
        if row is not None:
            rows.append(row)
    return rows


def _sdpa_kinds(square: bool) -> tuple[KernelKind, KernelKind]:
    """(forward, backward) kernel kinds of a dense SDPA measurement: ``sdpa`` when queries and keys
    are as many, else ``asym``."""
    a = AttentionKind.SDPA if square else AttentionKind.ASYM
    return tuple(kernel_kind(OpClass.ATTENTION, attention=a, direction=d) for d in Direction)  # type: ignore[return-value]


def _sweep_row(r: dict, t, file: str) -> AnchorRow | None:
    """A sweep row against the model; pinned where the curve was fitted to it (efficiency.yaml notes)."""
    if "error" in r:
        return None
    name, s, dt, ts = r["name"], r["shape"], r["dtype"], r["time_s"]
    if name.startswith(("mm ", "scaled_mm")):
        square = s["m"] == s["k"] == s["n"]
        return AnchorRow(name, file, ts, t("gemm", r["flops"], r["bytes"], dt), r["flops"], "TFLOP/s",
                         square and s["m"] >= 2048 or name.startswith("scaled_mm"))
    if name.startswith("sdpa"):
        if r.get("backend") != "default" or r["kind"] == "attention.fwd_bwd":
            return None
        f, b = _att_work(s["batch"], s["heads"], s["q_len"], s["kv_len"], s["head_dim"], s["causal"])
        fwd, bwd = _sdpa_kinds(s["q_len"] == s["kv_len"])
        if r["kind"] == "attention.fwd":  # the sweep file's own labels (hwmodels/bench/kernel_sweep.py)
            p, w = t(fwd, f, b), f
        else:
            p, w = t(bwd, 2 * f, 2 * b), 2 * f
        pinned = not s["causal"] and (r["kind"] == "attention.fwd" or fwd.attention is AttentionKind.ASYM)
        return AnchorRow(name, file, ts, p, w, "TFLOP/s", pinned)
    if name.startswith("embedding_bag"):
        e = 4.0 if dt == "fp32" else 2.0
        ids = s["bags"] * s["ids_per_bag"]
        read = ids * s["dim"] * e
        if r["kind"] == "embedding.fwd":
            p = t("embedding.fwd", 0.0, read + s["bags"] * s["dim"] * e, dt)
            return AnchorRow(name, file, ts, p, read, "TB/s", s["ids_per_bag"] >= 8 and dt == "fp32")
        if r["kind"] == "embedding.bwd":
            p = t("embedding.bwd", 0.0, s["bags"] * s["dim"] * e + ids * (2 * s["dim"] * e + 8), dt)
            return AnchorRow(name, file, ts, p, read, "TB/s", False)
        return None
    if name.startswith("copy"):
        return AnchorRow(name, file, ts, t("elementwise", 0.0, r["bytes"]), r["bytes"], "TB/s", r["bytes"] > 1e7)
    if name.startswith("a*b+c"):  # two kernels (mul, add), each moving half the bytes
        return AnchorRow(name, file, ts, 2 * t("elementwise", 0.0, r["bytes"] / 2), r["bytes"], "TB/s",
                         r["bytes"] > 1e7)
    if name.startswith("layer_norm") and r["kind"] in ("norm", "norm.bwd"):
        # reported, not pinned: the rows differ by row width, which a bytes curve cannot see
        # (efficiency.yaml, norm), and the curve is set for the executor's small norms
        return AnchorRow(name, file, ts, t("norm", 0.0, r["bytes"]), r["bytes"], "TB/s", False)
    return None


def format_anchor_table(rows: list[AnchorRow]) -> str:
    """A plain-text table of `anchor_table()` rows."""
    lines = [f"{'kernel':62s} {'measured':>10s} {'predicted':>10s} {'unit':7s} {'err':>7s}  pinned  source"]
    for r in rows:
        lines.append(f"{r.name[:62]:62s} {r.measured_rate:10.2f} {r.predicted_rate:10.2f} {r.unit:7s} "
                     f"{r.rel_err:+7.1%}  {'yes' if r.pinned else 'no ':6s}  {r.source.rsplit('/', 1)[-1]}")
    return "\n".join(lines)
