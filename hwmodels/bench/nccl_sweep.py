"""NCCL sweep on the GPUs of one host: every collective kind at sizes 4 B .. 1 GiB.

Run on the GPU box only (imports torch; nothing in hwmodels imports this file):

    torchrun --nproc-per-node 2 hwmodels/bench/nccl_sweep.py --out $OUT/nccl_2xh200_sweep.json

Sizes follow the nccl-tests "size" convention (hwmodels/collectives.py's table): all_reduce and
broadcast = the buffer; all_gather = each rank's gathered output; reduce_scatter = each rank's
input; all_to_all = each rank's send buffer; send_recv = the bytes rank 0 sends to rank 1.
alg_bw = size / time; bus_bw = alg_bw × bus factor (2(n-1)/n all_reduce, (n-1)/n gather /
scatter / all-to-all, 1 broadcast and send/recv). Time: ``iters`` ops back to back between two CUDA events
(as nccl-tests), median of 3 repeats, then the max over ranks (the slowest rank ends it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

SIZES_BYTES = [4, 1024, 8 * 1024, 64 * 1024, 256 * 1024] + [m << 20 for m in (1, 4, 16, 64, 256, 1024)]
KINDS = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv"]


def bus_factor(kind: str, n: int) -> float:
    # The same factors as hwmodels.collectives.bus_factor, kept here on purpose: this script runs
    # on the GPU image, where importing hwmodels would need the staged pydantic wheels.
    if kind == "all_reduce":
        return 2 * (n - 1) / n
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def make_op(kind: str, size: int, n: int, rank: int, dev: torch.device):
    # bf16 buffers where the size allows (reductions need a float type); uint8 for 4-byte rows of
    # data-movement kinds is fine too, but bf16 of 2 elements keeps one dtype everywhere.
    elems = max(size // 2, n)  # at least one element per rank
    elems = (elems + n - 1) // n * n  # divisible by the group
    buf = torch.ones(elems, dtype=torch.bfloat16, device=dev)
    if kind == "all_reduce":
        return lambda: dist.all_reduce(buf)
    if kind == "broadcast":
        return lambda: dist.broadcast(buf, src=0)
    if kind == "all_gather":
        shard = torch.ones(elems // n, dtype=torch.bfloat16, device=dev)
        return lambda: dist.all_gather_into_tensor(buf, shard)
    if kind == "reduce_scatter":
        out = torch.empty(elems // n, dtype=torch.bfloat16, device=dev)
        return lambda: dist.reduce_scatter_tensor(out, buf)
    if kind == "all_to_all":
        out = torch.empty_like(buf)
        return lambda: dist.all_to_all_single(out, buf)
    if kind == "send_recv":
        if rank == 0:
            return lambda: dist.send(buf, dst=1)
        if rank == 1:
            return lambda: dist.recv(buf, src=0)
        return lambda: None
    raise ValueError(f"kind={kind!r} unknown; use one of {KINDS}")


def time_op(op, iters: int, warmup: int, repeats: int = 3) -> float:
    """Per-op seconds as nccl-tests measures them: ``iters`` ops back to back between two CUDA
    events (so the host's launch cost hides behind the GPU), median over ``repeats``."""
    for _ in range(warmup):
        op()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        dist.barrier()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            op()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / iters)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file to write (rank 0)")
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--max-bytes", type=int, default=1 << 30)
    args = parser.parse_args()

    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local_rank)
    dev = torch.device("cuda", local_rank)
    dist.init_process_group("nccl", device_id=dev)
    rank, n = dist.get_rank(), dist.get_world_size()
    dist.barrier()

    rows = []
    t0 = time.time()
    for kind in args.kinds.split(","):
        for size in SIZES_BYTES:
            if size > args.max_bytes:
                continue
            iters, warmup = (5, 2) if size >= (1 << 30) else (10, 3) if size >= (256 << 20) else (30, 5)
            try:
                op = make_op(kind, size, n, rank, dev)
                t = torch.tensor([time_op(op, iters, warmup)], device=dev, dtype=torch.float64)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                time_s = float(t.item())
                alg = size / time_s
                rows.append({"kind": kind, "msg_bytes": size, "time_s": time_s, "alg_bw_Bps": alg,
                             "bus_bw_Bps": alg * bus_factor(kind, n), "iters": iters})
            except Exception as err:  # keep sweeping; record what failed
                rows.append({"kind": kind, "msg_bytes": size, "error": f"{type(err).__name__}: {err}"})
            torch.cuda.empty_cache()
            if rank == 0:
                r = rows[-1]
                print(f"{kind:15s} {size:>12d} B  " + (f"{r['time_s']*1e6:10.1f} us  bus {r['bus_bw_Bps']/1e9:7.1f} GB/s"
                                                          if "time_s" in r else r["error"]), flush=True)

    if rank == 0:
        env = {"torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
               "cuda": torch.version.cuda, "world_size": n,
               "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
               "env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")},
               "sweep_wall_s": time.time() - t0,
               "convention": "nccl-tests size/algbw/busbw; time = max over ranks of the median (3 repeats) of CUDA-event time over `iters` back-to-back ops / iters"}
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"environment": env, "rows": rows}, f, indent=1)
        print(f"wrote {args.out} ({len(rows)} rows, {time.time() - t0:.0f} s)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
