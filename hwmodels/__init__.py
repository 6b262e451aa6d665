"""Hardware as data: GPU catalog, network tiers, collective and kernel cost models, calibrations.

Never imports torch: the twin runs on a laptop.
"""

from hwmodels.calibration import Calibration, CalibrationRun, load_calibration, save_calibration
from hwmodels.collectives import COLLECTIVE_KINDS, collective_cost, collective_sms, collective_time_s
from hwmodels.gpus import DTYPES, GPUSpec, get_gpu, list_gpus
from hwmodels.kernels import DEFAULT_EFFICIENCY, OP_CLASSES, kernel_cost, kernel_time_s
from hwmodels.measured import MeasuredCeilings, measured_ceilings
from hwmodels.network import NetworkPreset, Tier, build_graph, get_network, list_networks

__all__ = [
    "COLLECTIVE_KINDS", "DEFAULT_EFFICIENCY", "DTYPES", "OP_CLASSES", "Calibration", "CalibrationRun",
    "GPUSpec", "MeasuredCeilings", "NetworkPreset", "Tier", "build_graph", "collective_cost",
    "collective_sms", "collective_time_s", "get_gpu", "get_network", "kernel_cost", "kernel_time_s",
    "list_gpus", "list_networks", "load_calibration", "measured_ceilings", "save_calibration",
]
