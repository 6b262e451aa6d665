"""``gemtwin`` with a deliberately changed kernel, for the drift check of ``gemtwin validate``.

Runs the CLI (``python -m executor.bench.drift_kernel train gem-h200-1gpu ...``) with causal
GDPA's tile table (``kernels.flash.tiles.SHORT_CAUSAL_ACT``, 64x32 tiles over 3 stages) replaced
by 32x16 tiles over one stage: the same math, slower attention kernels, and a Scenario and a
RunRecord that cannot tell. A twin calibrated on the real table should then miss the
attention class by more than its held-out error, which ``validate --fail-above`` names.
A bench harness: nothing in the library reads it.
"""

from __future__ import annotations

from kernels.flash import tiles
from kernels.flash.options import Config, Tiles

SLOW = Tiles(32, 16, 4, 1)


def main() -> None:
    tiles.SHORT_CAUSAL_ACT = Config(SLOW, SLOW, SLOW)
    from twin.cli import main as cli

    cli()


if __name__ == "__main__":
    main()
