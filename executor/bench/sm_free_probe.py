"""Does this machine's torch + NCCL take the SM-free route (``executor.collectives``)? One process,
one GPU: a 1-rank NCCL group created with the zero-CTA policy, symmetric memory on NCCL, then an
all-gather and an all-to-all through it. Prints what each piece answered (a multi-GPU run must
still read NCCL_DEBUG=INFO for "Copy Engine" to know the kernels took no SM).

    python -m executor.bench.sm_free_probe            # on a CUDA machine
"""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

import scenarios
from executor.collectives import SmFreeUnavailable, _nccl_version, enable_symmetric_memory, process_group_options


def main() -> None:
    s = scenarios.load("gem-h200-1gpu", ["parallelism.sm_free_collectives=true"])
    print(f"torch {torch.__version__}, NCCL {'.'.join(map(str, _nccl_version()))}")
    try:
        options = process_group_options(s, "nccl")
    except SmFreeUnavailable as e:
        print(f"refused: {e}")
        return
    print(f"options: cta_policy={options.config.cta_policy}")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, pg_options=options, device_id=torch.device("cuda", 0),
                            timeout=datetime.timedelta(seconds=60))
    try:
        enable_symmetric_memory(s, "nccl")
        x = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
        out = torch.empty_like(x)
        dist.all_gather_into_tensor(out, x, async_op=True).wait()
        y = torch.empty_like(x)
        dist.all_to_all_single(y, x, async_op=True).wait()
        torch.cuda.synchronize()
        print(f"all_gather ok={bool((out == x).all())}, all_to_all ok={bool((y == x).all())}")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
