"""Device-to-host copy rate of one GPU (what an async checkpoint's state copy runs at).

python -m hwmodels.bench.d2h_copy [out.json]: copies 256 MiB .. 4 GiB of bf16 from the GPU into
pinned and into pageable host memory, 5 timed repeats after a warm-up, and prints (writes) the
best bytes/s of each size. Needs torch and one CUDA device; the twin never imports this module.
"""

from __future__ import annotations

import json
import sys
import time


def _best_Bps(src, dst, repeats: int = 5) -> float:
    import torch

    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return src.numel() * src.element_size() / best


def main(argv: list[str]) -> dict:
    import torch

    rows = []
    for mib in (256, 1024, 4096):
        src = torch.empty(mib * 2**20 // 2, dtype=torch.bfloat16, device="cuda").normal_()
        pinned = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
        pageable = torch.empty(src.shape, dtype=src.dtype)
        rows.append({"bytes": mib * 2**20, "pinned_Bps": _best_Bps(src, pinned),
                     "pageable_Bps": _best_Bps(src, pageable, repeats=3)})
        del src, pinned, pageable
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d"), "rows": rows}
    text = json.dumps(out, indent=1)
    print(text)
    if argv:
        with open(argv[0], "w") as f:
            f.write(text + "\n")
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
