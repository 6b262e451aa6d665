import subprocess
import sys
from pathlib import Path

import pytest

from hwmodels import DTYPES, get_gpu, list_gpus, measured_ceilings

NUMBER_FIELDS = ("hbm_bytes", "hbm_bw_Bps", "sms", "nvlink_bw_Bps", "tdp_w")
DATASHEET_GPUS = ["b200", "gb200", "h100", "h200", "mi300x"]  # cpu is measured: tests/hwmodels/test_cpu_profile.py


def test_catalog_lists_the_seven_gpus_and_the_cpu():
    assert list_gpus() == ["a100-40gb", "a100-80gb", "b200", "cpu", "cpu-rank8", "gb200", "h100", "h200", "mi300x"]


@pytest.mark.parametrize("name", DATASHEET_GPUS)
def test_every_number_has_a_source(name):
    spec = get_gpu(name)
    fields = [f"peak_flops.{d}" for d in spec.peak_flops] + list(NUMBER_FIELDS)
    assert sorted(spec.sources) == sorted(fields)
    assert all(len(s) > 10 for s in spec.sources.values())
    assert {"fp32", "tf32", "bf16", "fp8", "mxfp8"} <= set(spec.peak_flops)


def test_anchor_peaks_and_units():
    assert get_gpu("h200").peak("bf16") == 989e12
    assert get_gpu("b200").peak("fp4") == 9e15
    assert get_gpu("gb200").peak("bf16") == 2.5e15
    assert get_gpu("mi300x").hbm_bw_Bps == 5.3e12
    assert get_gpu("h100").nvlink_bw_Bps == 450e9  # per direction
    for name in DATASHEET_GPUS:
        spec = get_gpu(name)
        assert spec.peak("fp32") < spec.peak("tf32") < spec.peak("bf16") < spec.peak("fp8")
    # the CPU's measured rates run the other way: its bf16 matmuls have no native path
    assert get_gpu("cpu").peak("bf16") < get_gpu("cpu").peak("fp32")


def test_mxfp8_is_emulated_on_hopper_native_on_blackwell():
    assert get_gpu("h100").peak("mxfp8") == get_gpu("h100").peak("fp8")
    assert "emulated" in get_gpu("h200").notes["peak_flops.mxfp8"]
    assert "native" in get_gpu("b200").notes["peak_flops.mxfp8"]


def test_lookup_is_case_insensitive():
    assert get_gpu("H200").name == "h200"


def test_unknown_gpu_message():
    with pytest.raises(ValueError) as e:
        get_gpu("h300")
    assert str(e.value) == ("unknown GPU 'h300'; known: a100-40gb, a100-80gb, b200, cpu, cpu-rank8, gb200, h100, h200, "
                            "mi300x")


def test_unknown_and_absent_dtype_messages():
    with pytest.raises(ValueError) as e:
        get_gpu("h100").peak("fp4")
    assert str(e.value) == ("GPU 'h100' has no peak for dtype 'fp4' (not in the catalog for this GPU); "
                            "use one of: fp32, tf32, bf16, fp8, mxfp8")
    with pytest.raises(ValueError, match=r"^GPU 'b200' has no peak for dtype 'int8' \(unknown dtype\)"):
        get_gpu("b200").peak("int8")
    assert set(DTYPES) == {"fp32", "tf32", "bf16", "fp8", "mxfp8", "fp4"}


def test_measured_h200_ceilings():
    m = measured_ceilings("h200")
    assert m.file == "hwmodels/data/measured/h200_2026-11-30.yaml"
    assert (m.date, m.environment.torch, m.environment.nccl) == ("2026-11-30", "2.11.0+cu130", "2.28.9")
    assert m.copy_Bps == 4.25e12 and m.matmul_flops["bf16"] == 780e12
    assert m.matmul_flops["fp8_rowwise"] == 1341e12 and m.matmul_flops["fp8_tensorwise"] == 1307e12
    assert [s.fwd_flops for s in m.sdpa] == [650e12, 410e12, 414e12]
    assert [e.read_Bps for e in m.embedding_bag] == [1.72e12, 1.02e12]
    assert len(m.nccl.rows) == 12 and m.nccl.all_reduce_4B_latency_s == 22e-6
    assert m.device.sms == get_gpu("h200").sms


def test_no_measurement_message():
    with pytest.raises(ValueError) as e:
        measured_ceilings("b200")
    assert str(e.value) == ("no measured ceilings for GPU 'b200'; measured: h100, h200; "
                            "add hwmodels/data/measured/b200_<date>.yaml")


def test_hwmodels_never_imports_torch():
    code = "import sys, hwmodels, hwmodels.network; sys.exit('torch' in sys.modules)"
    root = Path(__file__).resolve().parents[2]
    assert subprocess.run([sys.executable, "-c", code], cwd=root).returncode == 0


def test_a_measured_device_maps_to_its_catalog_entry():
    from hwmodels.gpus import catalog_name

    assert catalog_name("cuda", "NVIDIA H200") == "h200"
    assert catalog_name("cuda", "nvidia h100 80gb hbm3") == "h100"
    assert catalog_name("cpu", "AMD EPYC") == "cpu"  # any CPU is the measured cpu profile
    with pytest.raises(ValueError, match=r"^device 'NVIDIA A10G' is not in the GPU catalog .*add an entry"):
        catalog_name("cuda", "NVIDIA A10G")
