"""Collective sweep: all-gather, reduce-scatter, all-reduce and all-to-all over message sizes, on
every local GPU (NCCL) or CPU rank (gloo), through NCCL's SM-based kernels against its zero-CTA
copy-engine path (what ``parallelism.sm_free_collectives`` asks for, ``executor.collectives``).

    python -m executor.bench.collective_sweep --nproc 2 --out sweep.json            # 2 local GPUs
    python -m executor.bench.collective_sweep --nproc 2 --device cpu --sizes 4K,64K  # gloo, a check

Per (path, op, size): the median time of one collective (CUDA events around ``--iters`` back to back,
``--reps`` times; the slowest rank's), its algorithm bandwidth (bytes per rank / time) and bus
bandwidth (nccl-tests' factors: all-gather, reduce-scatter and all-to-all (n−1)/n, all-reduce
2(n−1)/n), which the twin's link model reads. ``size`` is the bytes each rank sends: all-gather's
input, reduce-scatter's output, all-reduce's tensor, all-to-all's whole buffer. With ``--overlap``
(CUDA) it also runs a bf16 matmul loop on the compute stream alone and then beside the collective
loop on a stream of its own, and reports the matmul's slowdown: the SMs a path takes from compute,
which is what "SM-free" is for.

Paths:
- ``sm``: the default NCCL group (SM kernels), ordinary buffers, as FSDP2 and the sharded tables use it;
- ``zero_cta``: a group created with NCCL's zero-CTA policy (``collectives.zero_cta_options``),
  buffers from symmetric memory on NCCL's backend, rendezvoused, ops issued ``async_op=True`` off
  the default stream (ENV.md). Copy-engine paths exist only for all-gather and all-to-all inside
  one NVLink domain; NCCL reports a fall-back to SM kernels only in its log, so the device script
  sets ``NCCL_DEBUG=INFO`` and keeps the lines that name the path (``executor/bench/h200_multi.sh``).
  A path this runtime cannot give is recorded with its one-line reason, not silently replaced.

The JSON (``--out``, written whole to a temporary file and renamed) carries torch's and NCCL's
versions, the device and the world size.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

OPS = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all")
PATHS = ("sm", "zero_cta")
UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
DEFAULT_SIZES = "64K,256K,1M,4M,16M,64M,256M,1G"


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor: the share of each rank's bytes that crosses its links."""
    return 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n


def parse_size(text: str) -> int:
    """``4M`` → 4,194,304 bytes (K, M, G are powers of 1,024); a bare number is bytes."""
    t = text.strip().upper().removesuffix("B")
    mult = UNITS.get(t[-1:], 1)
    digits = t[:-1] if t[-1:] in UNITS else t
    if not digits.isdigit() or int(digits) <= 0:
        raise ValueError(f"--sizes: '{text}' is not a size; use bytes or a number with K, M or G, e.g. 4M")
    return int(digits) * mult


@dataclass(frozen=True)
class Config:
    ops: tuple[str, ...]
    sizes: tuple[int, ...]
    paths: tuple[str, ...]
    iters: int = 20
    reps: int = 5
    warmup: int = 5
    overlap: bool = False
    device: str = "auto"  # auto (CUDA where there is one), cuda or cpu


@dataclass
class Row:
    path: str
    op: str
    size_bytes: int
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    overlap: dict = field(default_factory=dict)  # matmul ms alone, beside the collective, slowdown


def _config(argv=None) -> tuple[Config, int, Path | None]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=2, help="local ranks (GPUs with CUDA)")
    ap.add_argument("--ops", default=",".join(OPS), help=f"comma-separated, of {', '.join(OPS)}")
    ap.add_argument("--sizes", default=DEFAULT_SIZES, help="bytes per rank, comma-separated (K, M, G suffixes)")
    ap.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated, of {', '.join(PATHS)}")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--overlap", action="store_true", help="also time a matmul loop beside each collective (CUDA)")
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    ap.add_argument("--out", type=Path, default=None, help="the sweep's JSON")
    a = ap.parse_args(argv)
    ops, paths = tuple(a.ops.split(",")), tuple(a.paths.split(","))
    for name, got, allowed in (("--ops", ops, OPS), ("--paths", paths, PATHS)):
        bad = [x for x in got if x not in allowed]
        if bad:
            ap.error(f"{name}: '{bad[0]}' is not one of {', '.join(allowed)}")
    try:
        sizes = tuple(parse_size(x) for x in a.sizes.split(","))
    except ValueError as e:
        ap.error(str(e))
    if a.nproc < 2:
        ap.error(f"--nproc {a.nproc}: a collective sweep needs at least 2 ranks")
    if min(a.iters, a.reps) < 1 or a.warmup < 0:
        ap.error("--iters and --reps must be >= 1, --warmup >= 0")
    return Config(ops, sizes, paths, a.iters, a.reps, a.warmup, a.overlap, a.device), a.nproc, a.out


def main(argv=None) -> int:
    cfg, nproc, out = _config(argv)
    import torch

    from executor.launch import RankFailed, launch_local

    if cfg.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: this machine has no CUDA GPU; use --device cpu (gloo)", file=sys.stderr)
        return 2
    if _cuda(cfg) and nproc > torch.cuda.device_count():
        print(f"--nproc {nproc} needs {nproc} GPUs, torch sees {torch.cuda.device_count()}", file=sys.stderr)
        return 2
    try:
        result = launch_local(_rank, (cfg,), nproc, timeout_s=300)[0]
    except RankFailed as e:
        print(f"collective sweep: {e}", file=sys.stderr)
        return 1
    print(table(result))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(json.dumps(result, indent=1))
        tmp.replace(out)
        print(f"wrote {out}")
    return 0


def table(result: dict) -> str:
    lines = [f"{result['world_size']} ranks, {result['device']}, {result['backend']} {result.get('nccl', '')}".rstrip(),
             f"{'path':9} {'op':15} {'bytes':>11} {'us':>10} {'algbw GB/s':>11} {'busbw GB/s':>11} {'mm slowdown':>12}"]
    for r in result["rows"]:
        slow = r["overlap"].get("matmul_slowdown")
        lines.append(f"{r['path']:9} {r['op']:15} {r['size_bytes']:>11,} {r['time_us']:>10.1f} {r['algbw_gbps']:>11.1f} "
                     f"{r['busbw_gbps']:>11.1f} {'' if slow is None else f'{slow:.3f}':>12}")
    for path, why in result["unavailable"].items():
        lines.append(f"{path}: not run: {why}")
    return "\n".join(lines)


def _cuda(cfg: Config) -> bool:
    import torch

    return cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())


def _rank(cfg: Config) -> dict | None:
    """One rank: join the group, sweep every path it can take, return the rows (rank 0)."""
    import torch
    import torch.distributed as dist

    from executor.launch import find_launcher, init_group

    launched = find_launcher()
    cuda = _cuda(cfg)
    backend = "nccl" if cuda else "gloo"
    if cuda:
        torch.cuda.set_device(launched.local_rank)
    else:
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // launched.local_world_size))
    device = torch.device("cuda", launched.local_rank) if cuda else torch.device("cpu")
    init_group(launched, backend, device if cuda else None, 300.0)
    try:
        rows, unavailable = [], {}
        for path in cfg.paths:
            group, alloc, why = _path(path, backend, device)
            if group is None:
                unavailable[path] = why
                continue
            for op in cfg.ops:
                for size in cfg.sizes:
                    rows.append(_measure(cfg, path, op, size, group, alloc, device))
        info = {"world_size": launched.world_size, "backend": backend, "torch": torch.__version__,
                "device": torch.cuda.get_device_name(device) if cuda else "cpu",
                "config": asdict(cfg), "rows": [asdict(r) for r in rows], "unavailable": unavailable,
                "date": time.strftime("%Y-%m-%d")}  # fmt: skip
        if cuda:
            from executor.collectives import _nccl_version

            info["nccl"] = ".".join(map(str, _nccl_version()))
        return info if launched.rank == 0 else None
    finally:
        dist.destroy_process_group()


def _path(path: str, backend: str, device):
    """(group, buffer allocator, why not): the default group and ``torch.empty`` for ``sm``; a
    zero-CTA NCCL group and rendezvoused symmetric-memory buffers for ``zero_cta``."""
    import torch
    import torch.distributed as dist

    def plain(n, dtype):
        return torch.empty(n, dtype=dtype, device=device)

    if path == "sm":
        return dist.group.WORLD, plain, ""
    if backend != "nccl":
        return None, None, f"no copy-engine path on {backend} (NCCL on CUDA only)"
    from executor.collectives import SmFreeUnavailable, zero_cta_options

    fix = "leave zero_cta out of --paths"
    try:
        options = zero_cta_options(fix)
        from torch.distributed import _symmetric_memory as symm_mem

        symm_mem.set_backend("NCCL")
    except (SmFreeUnavailable, ImportError, RuntimeError) as e:
        return None, None, str(e).splitlines()[0]
    group = dist.new_group(backend="nccl", pg_options=options)

    def symmetric(n, dtype):
        t = symm_mem.empty(n, dtype=dtype, device=device)
        symm_mem.rendezvous(t, group)
        return t

    return group, symmetric, ""


def _measure(cfg: Config, path: str, op: str, size: int, group, alloc, device) -> Row:
    import torch
    import torch.distributed as dist

    n = dist.get_world_size(group)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    elems = max(n, size // dtype.itemsize // n * n)  # divisible by n for the sharded ops
    if op == "all_gather":
        src, dst = alloc(elems // n, dtype), alloc(elems, dtype)
    elif op == "reduce_scatter":
        src, dst = alloc(elems, dtype), alloc(elems // n, dtype)
    else:
        src, dst = alloc(elems, dtype), alloc(elems, dtype)
    nbytes = (elems // n if op in ("all_gather", "reduce_scatter") else elems) * dtype.itemsize

    # torch 2.13 renamed the tensor forms (*_single); 2.11, on the GPU image, has the old names only
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

    def one():
        if op == "all_gather":
            return gather(dst, src, group=group, async_op=True)
        if op == "reduce_scatter":
            return scatter(dst, src, group=group, async_op=True)
        if op == "all_reduce":
            return dist.all_reduce(src, group=group, async_op=True)
        return dist.all_to_all_single(dst, src, group=group, async_op=True)

    cuda = device.type == "cuda"
    stream = torch.cuda.Stream(device) if cuda else None
    _check(op, one, src, dst, n, dist.get_rank(group), stream)

    def loop(k):
        works = [one() for _ in range(k)]
        for w in works:
            w.wait()

    times = []
    for rep in range(cfg.reps + 1):  # rep 0 is the warm-up
        k = cfg.warmup if rep == 0 else cfg.iters
        if k == 0:
            continue
        dist.barrier(group=group)
        if cuda:
            with torch.cuda.stream(stream):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                loop(k)
                b.record()
            b.synchronize()
            t = a.elapsed_time(b) / 1e3 / k
        else:
            t0 = time.perf_counter()
            loop(k)
            t = (time.perf_counter() - t0) / k
        if rep:
            times.append(t)
    t = torch.tensor([statistics.median(times)], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)  # the slowest rank's
    sec = float(t.item())
    row = Row(path, op, nbytes, sec * 1e6, nbytes / sec / 1e9, nbytes / sec / 1e9 * bus_factor(op, n))
    if cfg.overlap and cuda:
        row.overlap = _overlap(cfg, one, stream, group, device)
    return row


def _check(op: str, one, src, dst, n: int, rank: int, stream) -> None:
    """One collective on known values (small integers, exact in bf16), its result checked: a path
    that moved the wrong bytes fails the sweep instead of timing it."""
    import torch

    chunk = src.numel() // n
    if op == "all_to_all":  # chunk j of rank r holds r·n + j; chunk i received by rank r holds i·n + r
        src.copy_((rank * n + torch.arange(n, device=src.device)).repeat_interleave(chunk))
        want = (torch.arange(n, device=src.device) * n + rank).repeat_interleave(chunk)
    else:
        src.fill_(rank + 1)
        total = n * (n + 1) // 2
        want = {"all_gather": torch.arange(1, n + 1, device=src.device).repeat_interleave(dst.numel() // n),
                "reduce_scatter": torch.full((dst.numel(),), total, device=src.device),
                "all_reduce": torch.full((src.numel(),), total, device=src.device)}[op]
    if stream is not None:
        stream.wait_stream(torch.cuda.current_stream(src.device))
        with torch.cuda.stream(stream):
            one().wait()
        torch.cuda.current_stream(src.device).wait_stream(stream)
    else:
        one().wait()
    got = src if op == "all_reduce" else dst
    if not torch.equal(got.float(), want.float()):
        raise RuntimeError(f"{op} of {src.numel() * src.element_size():,} bytes gave wrong values on rank {rank}")


def _overlap(cfg: Config, one, stream, group, device) -> dict:
    """A bf16 4096³ matmul loop on the default stream, alone and with the collective looping on
    ``stream`` meanwhile: their times and the matmul's slowdown (1.0: the collective took no SM)."""
    import torch
    import torch.distributed as dist

    a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    k = 20

    def mm_loop():
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(k):
            torch.mm(a, b)
        e1.record()
        return e0, e1

    mm_loop()
    torch.cuda.synchronize(device)
    dist.barrier(group=group)
    e0, e1 = mm_loop()
    e1.synchronize()
    alone = e0.elapsed_time(e1)
    dist.barrier(group=group)
    with torch.cuda.stream(stream):
        c0, c1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        c0.record()
        works = [one() for _ in range(cfg.iters)]
    e0, e1 = mm_loop()
    with torch.cuda.stream(stream):
        for w in works:
            w.wait()
        c1.record()
    torch.cuda.synchronize(device)
    beside = e0.elapsed_time(e1)
    return {"matmul_ms_alone": alone, "matmul_ms_beside": beside, "matmul_slowdown": beside / alone,
            "collective_ms_beside": c0.elapsed_time(c1) / cfg.iters}


if __name__ == "__main__":
    raise SystemExit(main())
