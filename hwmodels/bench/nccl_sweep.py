"""Collective sweep on the GPUs of one host: every collective kind at sizes 4 B .. 1 GiB, through
NCCL's SM kernels and (``--paths sm,zero_cta``) its zero-CTA copy-engine path.

Run on the GPU box under torchrun, or let it start the ranks (torch's elastic launcher):

    torchrun --nproc-per-node 2 hwmodels/bench/nccl_sweep.py --out $OUT/nccl_2xh200_sweep.json
    python hwmodels/bench/nccl_sweep.py --nproc 2 --paths sm,zero_cta --overlap --out $OUT/sweep.json
    python hwmodels/bench/nccl_sweep.py --nproc 2 --device cpu --max-bytes 65536 --out x.json   # gloo, a check

Sizes follow the nccl-tests "size" convention (hwmodels/collectives.py's table): all_reduce and
broadcast = the buffer; all_gather = each rank's gathered output; reduce_scatter = each rank's
input; all_to_all = each rank's send buffer; send_recv = the bytes rank 0 sends to rank 1.
alg_bw = size / time; bus_bw = alg_bw × bus factor (2(n-1)/n all_reduce, (n-1)/n gather /
scatter / all-to-all, 1 broadcast and send/recv). Time: ``iters`` ops back to back between two CUDA
events (as nccl-tests; wall clock on the CPU), median of 3 repeats, then the max over ranks (the
slowest rank ends it). Before it is timed, each (kind, size) runs once on known values and its
result is checked: a path that moves the wrong bytes stops the sweep instead of being timed.

Paths (``--paths``):
- ``sm``: the default group (NCCL's SM kernels; gloo on the CPU), ordinary buffers, ops issued on
  the current stream, as the first sweep (2026-11-30) measured them;
- ``zero_cta``: what ``parallelism.sm_free_collectives`` asks for (``executor.collectives``,
  ENV.md): a group created with NCCL's zero-CTA policy, buffers from symmetric memory on NCCL's
  backend, rendezvoused, ops ``async_op=True`` on a stream of their own. Copy-engine paths exist
  for all-gather and all-to-all inside one NVLink domain (reduce-scatter runs as a low-CTA
  kernel); NCCL says which path it took only in its log, so the device script sets
  ``NCCL_DEBUG=INFO`` and keeps those lines. A path this runtime cannot give is recorded with its
  one-line reason (``unavailable``), never replaced by another. Needs the staged pydantic wheels on
  the GPU image (``executor.collectives`` reads the Scenario schema).

``--overlap`` (CUDA): a bf16 4096³ matmul loop on the default stream, alone and then beside the
collective looping on its own stream; the matmul's slowdown is the SMs the path takes from the
compute it overlaps (1.0: none), which the twin's ``sm_contention`` prices.

The JSON (written whole, then renamed) has ``environment`` and ``rows`` (``kind``, ``msg_bytes``,
``time_s``, ``alg_bw_Bps``, ``bus_bw_Bps``, ``iters``, ``path``, ``overlap``), as
``tests/hwmodels/test_nccl_sweep.py`` and the network fit read them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

SIZES_BYTES = [4, 1024, 8 * 1024, 64 * 1024, 256 * 1024] + [m << 20 for m in (1, 4, 16, 64, 256, 1024)]
KINDS = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv"]
PATHS = ["sm", "zero_cta"]


def bus_factor(kind: str, n: int) -> float:
    # The same factors as hwmodels.collectives.bus_factor, kept here on purpose: the sm path runs
    # on the GPU image without the staged wheels, where importing hwmodels would need pydantic.
    if kind == "all_reduce":
        return 2 * (n - 1) / n
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def make_op(kind: str, size: int, n: int, rank: int, dev: torch.device, *, group=None, alloc=None):
    """``(op, check)``: ``op()`` issues one collective (returns its work handle, or None), ``check()``
    fills the buffers with known small integers (exact in bf16), runs ``op`` once and raises if a
    rank got the wrong values. ``alloc(elems)`` makes the buffers (default ``torch.empty``)."""
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32  # gloo reduces no bf16
    alloc = alloc or (lambda k: torch.empty(k, dtype=dtype, device=dev))
    elems = max(size // dtype.itemsize, n)  # at least one element per rank
    elems = (elems + n - 1) // n * n  # divisible by the group
    buf = alloc(elems)
    total = n * (n + 1) // 2  # sum over ranks of rank + 1
    ar = torch.arange(n, device=dev)
    kw = dict(group=group, async_op=True)
    # torch 2.13 renamed the tensor forms (*_single); 2.11, on the GPU image, has the old names only
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    if kind == "all_reduce":
        op, fill, got, want = (lambda: dist.all_reduce(buf, **kw)), (lambda: buf.fill_(rank + 1)), buf, \
            lambda: torch.full_like(buf, total)
    elif kind == "broadcast":
        op, fill, got, want = (lambda: dist.broadcast(buf, src=0, **kw)), (lambda: buf.fill_(rank + 1)), buf, \
            lambda: torch.ones_like(buf)
    elif kind == "all_gather":
        shard = alloc(elems // n)
        op, fill, got, want = (lambda: gather(buf, shard, **kw)), (lambda: shard.fill_(rank + 1)), buf, \
            lambda: (ar + 1).repeat_interleave(elems // n).to(buf.dtype)
    elif kind == "reduce_scatter":
        out = alloc(elems // n)
        op, fill, got, want = (lambda: scatter(out, buf, **kw)), (lambda: buf.fill_(rank + 1)), out, \
            lambda: torch.full_like(out, total)
    elif kind == "all_to_all":  # chunk j of rank r holds r·n + j; chunk i received by rank r holds i·n + r
        out = alloc(elems)
        op = lambda: dist.all_to_all_single(out, buf, **kw)  # noqa: E731
        fill = lambda: buf.copy_((rank * n + ar).repeat_interleave(elems // n))  # noqa: E731
        got, want = out, lambda: (ar * n + rank).repeat_interleave(elems // n).to(out.dtype)
    elif kind == "send_recv":
        if rank == 0:
            op = lambda: dist.isend(buf, dst=1, group=group)  # noqa: E731
        elif rank == 1:
            op = lambda: dist.irecv(buf, src=0, group=group)  # noqa: E731
        else:
            op = lambda: None  # noqa: E731
        fill, got = (lambda: buf.fill_(rank + 1)), buf
        want = lambda: torch.full_like(buf, 1 if rank <= 1 else rank + 1)  # noqa: E731
    else:
        raise ValueError(f"kind={kind!r} unknown; use one of {KINDS}")

    def check() -> None:
        fill()
        _sync(dev)
        work = op()
        if work is not None:
            work.wait()
        _sync(dev)
        if not torch.equal(got.float(), want().float()):
            raise RuntimeError(f"{kind} of {size:,} bytes gave wrong values on rank {rank}")

    return op, check


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def time_op(op, iters: int, warmup: int, dev: torch.device, group=None, stream=None, repeats: int = 3) -> float:
    """Per-op seconds as nccl-tests measures them: ``iters`` ops back to back between two CUDA
    events (so the host's launch cost hides behind the GPU; wall clock on the CPU), median over
    ``repeats``. ``stream``: issue them there (the zero-CTA path's own stream)."""
    def run(k: int) -> None:
        works = [op() for _ in range(k)]
        for w in works:
            if w is not None:
                w.wait()

    times = []
    for rep in range(repeats + 1):  # repeat 0 warms up
        k = warmup if rep == 0 else iters
        dist.barrier(group=group)
        _sync(dev)
        if dev.type == "cuda":
            s = stream or torch.cuda.current_stream(dev)
            with torch.cuda.stream(s):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                run(k)
                end.record()
            end.synchronize()
            t = start.elapsed_time(end) / 1e3 / max(k, 1)
        else:
            t0 = time.perf_counter()
            run(k)
            t = (time.perf_counter() - t0) / max(k, 1)
        if rep:
            times.append(t)
    return statistics.median(times)


def overlap(op, iters: int, dev: torch.device, stream, group=None) -> dict:
    """A bf16 4096³ matmul loop on the default stream alone, then with ``iters`` collectives issued
    on ``stream`` meanwhile: both times and the matmul's slowdown (1.0: the path took no SM)."""
    a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)

    def mm_loop():
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(20):
            torch.mm(a, b)
        e1.record()
        return e0, e1

    mm_loop()
    _sync(dev)
    dist.barrier(group=group)
    e0, e1 = mm_loop()
    e1.synchronize()
    alone = e0.elapsed_time(e1)
    dist.barrier(group=group)
    _sync(dev)
    with torch.cuda.stream(stream):
        c0, c1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        c0.record()
        works = [op() for _ in range(iters)]
    e0, e1 = mm_loop()
    with torch.cuda.stream(stream):
        for w in works:
            if w is not None:
                w.wait()
        c1.record()
    _sync(dev)
    beside = e0.elapsed_time(e1)
    return {"matmul_ms_alone": alone, "matmul_ms_beside": beside, "matmul_slowdown": beside / alone,
            "collective_s_beside": c0.elapsed_time(c1) / 1e3 / iters}


def path_group(path: str, dev: torch.device):
    """``(group, alloc, why_not)``: the default group and plain buffers for ``sm``; for ``zero_cta``
    a new NCCL group with the zero-CTA policy and rendezvoused symmetric-memory buffers, or None
    and the one-line reason this runtime cannot give it."""
    if path == "sm":
        return None, None, ""
    if dev.type != "cuda":
        return None, None, "no copy-engine path off NCCL (gloo on the CPU)"
    try:
        from executor.collectives import zero_cta_options

        options = zero_cta_options("leave zero_cta out of --paths")
        from torch.distributed import _symmetric_memory as symm_mem

        symm_mem.set_backend("NCCL")
    except (ImportError, RuntimeError, ValueError) as e:  # SmFreeUnavailable is a ValueError
        return None, None, str(e).splitlines()[0]
    group = dist.new_group(backend="nccl", pg_options=options)

    def alloc(k: int) -> torch.Tensor:
        t = symm_mem.empty(k, dtype=torch.bfloat16, device=dev)
        symm_mem.rendezvous(t, group)
        return t

    return group, alloc, ""


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file to write (rank 0)")
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--paths", default="sm", help=f"comma-separated, of {', '.join(PATHS)}")
    parser.add_argument("--max-bytes", type=int, default=1 << 30)
    parser.add_argument("--min-bytes", type=int, default=0)
    parser.add_argument("--overlap", action="store_true", help="also time a matmul loop beside each collective (CUDA)")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--nproc", type=int, default=0, help="start this many local ranks (outside torchrun)")
    a = parser.parse_args(argv)
    for name, got, allowed in (("--kinds", a.kinds, KINDS), ("--paths", a.paths, PATHS)):
        bad = [x for x in got.split(",") if x not in allowed]
        if bad:
            parser.error(f"{name}: '{bad[0]}' is not one of {', '.join(allowed)}")
    if a.nproc == 1 or a.nproc < 0:
        parser.error(f"--nproc {a.nproc}: a sweep needs at least 2 ranks")
    return a


def sweep(a: argparse.Namespace) -> dict | None:
    """One rank's sweep (torchrun's variables set); rank 0 returns the result."""
    cuda = a.device == "cuda" or (a.device == "auto" and torch.cuda.is_available())
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if cuda:
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    else:
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // int(os.environ.get("LOCAL_WORLD_SIZE", 1))))
        dev = torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", device_id=dev if cuda else None)
    rank, n = dist.get_rank(), dist.get_world_size()
    rows, unavailable = [], {}
    t0 = time.time()
    try:
        for path in a.paths.split(","):
            group, alloc, why = path_group(path, dev)
            if why:
                unavailable[path] = why
                if rank == 0:
                    print(f"{path}: not run: {why}", flush=True)
                continue
            stream = torch.cuda.Stream(dev) if cuda and (path != "sm" or a.overlap) else None
            for kind in a.kinds.split(","):
                if kind == "send_recv" and path != "sm":
                    continue  # point-to-point has no copy-engine path to compare
                for size in SIZES_BYTES:
                    if not a.min_bytes <= size <= a.max_bytes:
                        continue
                    iters, warmup = (5, 2) if size >= (1 << 30) else (10, 3) if size >= (256 << 20) else (30, 5)
                    op, check = make_op(kind, size, n, rank, dev, group=group, alloc=alloc)
                    check()
                    t = torch.tensor([time_op(op, iters, warmup, dev, group, stream)], dtype=torch.float64, device=dev)
                    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
                    time_s = float(t.item())
                    alg = size / time_s
                    row = {"kind": kind, "msg_bytes": size, "time_s": time_s, "alg_bw_Bps": alg,
                           "bus_bw_Bps": alg * bus_factor(kind, n), "iters": iters, "path": path}
                    if a.overlap and cuda:
                        row["overlap"] = overlap(op, iters, dev, stream, group)
                    rows.append(row)
                    if cuda:
                        torch.cuda.empty_cache()
                    if rank == 0:
                        slow = row.get("overlap", {}).get("matmul_slowdown")
                        print(f"{path:8s} {kind:15s} {size:>12d} B  {time_s * 1e6:10.1f} us  bus "
                              f"{row['bus_bw_Bps'] / 1e9:7.1f} GB/s" + (f"  matmul x{slow:.3f}" if slow else ""),
                              flush=True)
    finally:
        dist.destroy_process_group()
    if rank != 0:
        return None
    env = {"torch": torch.__version__, "backend": "nccl" if cuda else "gloo", "world_size": n,
           "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None, "cuda": torch.version.cuda,
           "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else [],
           "env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")},
           "sweep_wall_s": time.time() - t0, "paths": a.paths.split(","), "unavailable": unavailable,
           "convention": "nccl-tests size/algbw/busbw; time = max over ranks of the median (3 repeats) of CUDA-event "
                         "time over `iters` back-to-back ops / iters; each (path, kind, size) checked on known values first"}
    return {"environment": env, "rows": rows}


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.nproc:  # start the ranks here (torch's elastic launcher, as gemtwin train --nproc)
        from executor.launch import RankFailed, launch_local

        try:
            result = launch_local(sweep, (a,), a.nproc, timeout_s=300)[0]
        except RankFailed as e:
            print(f"nccl_sweep: {e}", file=sys.stderr)
            return 1
    else:
        result = sweep(a)
    if result is not None:
        out = Path(a.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(json.dumps(result, indent=1))
        tmp.replace(out)
        print(f"wrote {out} ({len(result['rows'])} rows, {result['environment']['sweep_wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
