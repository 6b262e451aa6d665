"""Profiler events → per-step time by op class (``twin.runrecord.OP_CLASSES``).

Each CPU-side event's *self* time (on CPU) or the time of each GPU event it launched itself
(on CUDA) goes to one class:

1. ``optimizer``: inside a ``record_function("optimizer")`` region; the embeddings' row-wise
   Adagrad kernels fused into the lookups' backward (``_adagrad*`` outside that region) count as
   ``embedding``, as the twin prices them (the table-batched backward with its update);
2. ``attention``: inside a ``record_function("attention.<kind>")`` region or a
   ``gemtwin::attention_<kind>_fwd``/``_bwd`` op (the attention family's Triton op), or the backward of
   an op that ran there (autograd nodes carry the forward op's ``sequence_nr``); the same
   events are also summed per region name (``kernel_times``: ``attention.gdpa`` ...);
3. otherwise by the nearest self-or-ancestor name: ``gemm`` (mm, addmm, bmm, baddbmm, matmul,
   linear, einsum, the MoE's ``_grouped_mm`` and their backward nodes; the MXFP8 GEMM's
   ``mxfp8.gemm`` range), ``quantize``
   (the MXFP8 linears' ``mxfp8.quantize`` range, quantize kernels; in a compiled graph, where
   those ranges are dropped, by the GPU kernels' names: ``_mx_mm*`` and ``*quantize*``), ``embedding`` (embedding,
   embedding_bag, the Triton TBE's ``PooledLookup`` / ``UnpooledLookup`` and their backward), ``norm``
   (layer_norm and its backward);
4. ``other`` for host-to-device copies (the batch's upload, the twin's ``data.h2d``);
   ``elementwise`` for element-wise and reduction ops (activations, arithmetic, softmax, copies,
   BCE) and for ``torch.compile``'s generated pointwise/reduction kernels (``triton_poi_``,
   ``triton_red_``, ``triton_per_``; those that fuse a layer norm count as ``norm`` by step 3),
   ``other`` for the rest (indexing, cat, top-k, autograd bookkeeping).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator

from torch.autograd import DeviceType

from scenarios.vocab import OP_CLASSES, attention_label, attention_of

_BY_NAME = [
    ("gemm", re.compile(r"^(aten::)?(mm|addmm|bmm|baddbmm|matmul|linear|einsum|_addmm_activation|_grouped_mm)$"
                        r"|^(Mm|Addmm|Bmm|Baddbmm|Matmul|Linear|GroupedMm)Backward|^mxfp8\.gemm$|^fp8block\.gemm$"
                        r"|mx_mm|^aten::_scaled_mm", re.I)),
    # the MXFP8 and blockwise-fp8 linears' *.quantize ranges, quantize kernels (fp8block's _dual*_kernel)
    ("quantize", re.compile(r"quantize|^_dual4?_kernel", re.I)),
    ("embedding", re.compile(r"embedding|^(Pooled|Unpooled)Lookup", re.I)),
    ("norm", re.compile(r"layer_norm|LayerNormBackward", re.I)),
]
_ELEMENTWISE = re.compile(  # gemtwin::bias_gelu: kernels.ffn.bias_gelu (its forward and backward ops)
    r"^(aten::|gemtwin::)?_?(bias_gelu|add|sub|rsub|mul|div|neg|abs|exp|log|pow|sqrt|rsqrt|square|clamp|where|threshold|"
    r"relu|gelu|silu|sigmoid|tanh|softmax|log_softmax|erf|fill|zero|copy|to|_to_copy|masked_fill|"
    r"binary_cross_entropy|maximum|minimum|sum|mean|lerp|addcmul|addcdiv)",
    re.I,
)

_INDUCTOR = re.compile(r"^triton_(poi|red|per)_")  # Inductor's fused element-wise / reduction kernels
# CUDA runtime / driver calls (cudaEventRecordWithFlags, cudaStreamIsCapturing, cuLaunchKernel ...).
# One made outside any op carries its own correlation id where an op's would be, and torch 2.11
# attaches to it the kernels of the op whose id it matches: they were counted twice (s22, under
# ``other``: cudaEventRecordWithFlags 0.36 ms of a bias GEMM's kernels ...). Runtime calls
# launch nothing on their own account that an op does not already own.
_RUNTIME = re.compile(r"^cu(da)?[A-Z]")
# GPU kernel names: our MXFP8 GEMM, and cuBLAS(Lt)'s GEMMs (nvjet_*, *_gemm_*, split-K's reduction) where
# the op's name does not tell, as under ``gemtwin::gelu_ffn``: its GEMMs carry the GELU in their epilogues
_BY_KERNEL = [("gemm", re.compile(r"^_mx_mm|^nvjet_|gemm|splitKreduce", re.I)),
              ("quantize", re.compile(r"quantize|^_dual4?_kernel"))]
# the embeddings' sparse row-wise Adagrad fused into the lookups' backward (``kernels.embedding``)
_FUSED_UPDATE_KERNEL = re.compile(r"^_adagrad")


def _ancestors(e):
    while e is not None:
        yield e
        e = e.cpu_parent


def _is_backward(e) -> bool:
    return any("Backward" in a.name or a.name.startswith("autograd::engine") for a in _ancestors(e))


# the attention family's ops (``kernels/attention/op.py``): their kernels are filed under them
_ATTENTION_OP = re.compile(r"^gemtwin::attention_(\w+?)_(fwd|bwd)$")


def _region(e) -> str | None:
    """The attention region (``attention.<kind>``) an event runs in, if any: a
    ``record_function("attention.<kind>")`` range or a ``gemtwin::attention_<kind>_fwd/bwd`` op."""
    for a in _ancestors(e):
        if attention_of(a.name) is not None:
            return a.name
        if m := _ATTENTION_OP.match(a.name):
            return attention_label(m.group(1))
    return None


def _attention_seq(events) -> dict[int, str]:
    """Sequence numbers of autograd nodes created inside an attention region -> the region.

    A forward op that creates no node reports the *next* number, so a number belongs to the
    last forward op (by start time) that reports it.
    """
    creator: dict[int, object] = {}
    for e in events:
        if e.sequence_nr >= 0 and not _is_backward(e):
            c = creator.get(e.sequence_nr)
            if c is None or e.time_range.start >= c.time_range.start:
                creator[e.sequence_nr] = e
    return {s: r for s, e in creator.items() if (r := _region(e)) is not None}


def attention_region(e, attention_seq: dict[int, str]) -> str | None:
    """The attention region an event belongs to, forward or backward."""
    region = _region(e)
    if region is not None:
        return region
    for a in _ancestors(e):
        if "Backward" in a.name and a.sequence_nr in attention_seq:
            return attention_seq[a.sequence_nr]
    return None


def classify(e, attention_seq: dict[int, str], kernel: str | None = None) -> str:
    """The op class of CPU-side event ``e`` (on CUDA: of the GPU ``kernel`` it launched)."""
    names = [a.name for a in _ancestors(e)]
    if "optimizer" in names:
        return "optimizer"
    if kernel and _FUSED_UPDATE_KERNEL.search(kernel):
        return "embedding"
    if kernel and kernel.startswith("Memcpy HtoD"):  # the batch's upload: the twin's data.h2d op
        return "other"
    if attention_region(e, attention_seq) is not None:
        return "attention"
    for name in names:
        for cls, pattern in _BY_NAME:
            if pattern.search(name):
                return cls
    # Inductor launches a user-defined Triton kernel (the MXFP8 linears' GEMM and quantizers
    # inside a compiled graph) under a range named "triton kernel", and dynamo drops the
    # ``record_function`` ranges around them (s19): the GPU kernels' own names tell
    for k in [kernel] if kernel else [k.name for k in getattr(e, "kernels", None) or ()]:
        for cls, pattern in _BY_KERNEL:
            if pattern.search(k):
                return cls
    return "elementwise" if _ELEMENTWISE.search(e.name) or _INDUCTOR.search(e.name) else "other"


def _self_times(prof, device: str):
    """(CPU-side event, seconds, name) for every unit of time, each counted once.

    On CPU: every CPU event's self time (the name is the event's). On CUDA: every GPU event
    (kernel, memcpy, memset) the profiler attached to the CPU op that launched it, with the
    kernel's name. A "kernel" that bears its own event's name over ops that launched kernels of
    their own is not work: it is the GPU-side mirror of a ``record_function`` range, a span over
    kernels already counted under the ops inside it (an Inductor kernel's launch range also
    bears its kernel's name, but has nothing under it). ``FunctionEvent.self_device_time_total``
    counts those spans, which counted the kernels under them twice (s18: the classes summed to
    61.5 ms against 57.1 ms of GPU events). CUDA runtime calls' "kernels" are skipped too
    (``_RUNTIME``).
    """
    for e in prof.events():
        if e.device_type != DeviceType.CPU or e.is_async:
            continue
        if device == "cuda" and _RUNTIME.match(e.name):
            continue
        if device != "cuda":
            if e.self_cpu_time_total > 0:
                yield e, e.self_cpu_time_total * 1e-6, e.name
            continue
        for k in e.kernels:
            if k.duration > 0 and not (k.name == e.name and _spans_work(e)):
                yield e, k.duration * 1e-6, k.name


def _spans_work(e) -> bool:
    """Whether ops under ``e`` launched GPU work (``e`` is a range over them)."""
    return any(c.kernels or _spans_work(c) for c in e.cpu_children)


def op_class_times(prof, *, per_steps: int, device: str = "cpu") -> dict[str, float]:
    """Seconds per step by op class over the profiled ``per_steps`` steps (all classes present)."""
    seqs = _attention_seq(prof.events())
    out = {c: 0.0 for c in OP_CLASSES}
    for e, s, kernel in _self_times(prof, device):
        out[classify(e, seqs, kernel if device == "cuda" else None)] += s / max(per_steps, 1)
    return out


def op_class_kernels(prof, *, per_steps: int, device: str = "cpu", top: int = 8) -> dict[str, dict[str, float]]:
    """Each op class's longest kernels (CPU: ops): ``{class: {name: seconds per step}}``, the
    ``top`` longest per class, longest first; what a class's time is made of. ``other``'s
    kernels are named ``"<launching op>: <kernel>"``, so that a missing rule shows."""
    seqs = _attention_seq(prof.events())
    acc: dict[str, dict[str, float]] = {}
    for e, s, name in _self_times(prof, device):
        cls = classify(e, seqs, name if device == "cuda" else None)
        if cls == "other" and device == "cuda":
            name = f"{e.name}: {name}"  # the unclassified: which op launched it
        row = acc.setdefault(cls, {})
        row[name] = row.get(name, 0.0) + s / max(per_steps, 1)
    return {c: dict(sorted(acc[c].items(), key=lambda kv: -kv[1])[:top]) for c in OP_CLASSES if c in acc}


def kernel_times(prof, *, per_steps: int, device: str = "cpu") -> dict[str, float]:
    """Seconds per step of each attention kind (``attention.gdpa``, ``attention.asym`` ...),
    forward and backward together."""
    seqs = _attention_seq(prof.events())
    out: dict[str, float] = {}
    for e, s, _ in _self_times(prof, device):
        region = attention_region(e, seqs)
        if region is not None:
            out[region] = out.get(region, 0.0) + s / max(per_steps, 1)
    return out


# ---- the profiler's own console lines -------------------------------------------------------
# libkineto (as torch 2.13 ships it) writes "USDT:<date> <pid>:<tid> SyncActivityProfilerHandler.cpp:52]
# profiler_start" (and profiler_stop) to std::cerr at every trace start and stop: markers for
# USDT probes, at a severity above ERROR, so torch's default (ERROR and up) does not hide them;
# the only switch is the KINETO_LOG_LEVEL environment variable, read once at kineto's first use,
# and a level that hides them hides kineto's errors too. So they are filtered where they are
# written: fd 2, for the duration of the profiler's start and stop calls.
KINETO_NOTICE = b"USDT:"


@contextlib.contextmanager
def without_kineto_notices() -> Iterator[None]:
    """Run the body with file descriptor 2 caught; then write back every line it got except
    libkineto's ``USDT:`` notices. Only short calls belong inside (the profiler's start, stop):
    what the process writes to stderr meanwhile comes out when the body ends."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no stderr at all: nothing to filter
        yield
        return
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            kept = [line for line in caught.read().splitlines(keepends=True) if not line.startswith(KINETO_NOTICE)]
            if kept:
                os.write(2, b"".join(kept))


# ---- a profiling session over a few steps ---------------------------------------------------
def start_profiler(device_type: str, *, shapes: bool = False):
    """``torch.profiler.profile`` started on the CPU (and CUDA) activities, its notices dropped;
    ``shapes``: record the ops' input shapes too."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device_type == "cuda" else [])
    # one profiling cycle: keeping its events (acc_events) changes nothing and spares the warning
    # torch prints otherwise ("Profiler clears events at the end of each cycle")
    prof = profile(activities=acts, acc_events=True, record_shapes=shapes)
    with without_kineto_notices():
        prof.start()
    return prof


def stop_profiler(prof) -> None:
    with without_kineto_notices():
        prof.stop()


def write_trace(prof, path, device_type: str) -> None:
    """The profiled steps' Chrome/Perfetto trace at ``path`` (gzipped when it ends in .gz) and
    their op table, sorted by device time (CPU: CPU time), at ``<path>.top.txt``."""
    from pathlib import Path

    from scenarios.files import write_text_atomic

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))
    key = "self_device_time_total" if device_type == "cuda" else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=key, row_limit=40, max_name_column_width=70)
    write_text_atomic(Path(str(path) + ".top.txt"), table + "\n")
