"""The A100 generation (issue 23): catalog entries, their sources, the ampere curves, the A100 fabrics
priced against the published measurements they cite, and the one-line error for fp8 on Ampere."""

import pytest
from typer.testing import CliRunner

import scenarios
from hwmodels import get_gpu, get_network, kernel_cost
from hwmodels._data import load_yaml
from hwmodels.collectives import bus_factor, collective_cost
from hwmodels.gpus import catalog_name
from hwmodels.kernels import efficiency_table, family_name
from twin.cli import app
from twin.workload import Hardware

A100S = ["a100-40gb", "a100-80gb"]
A100_NETWORKS = ["dgx-a100-hdr", "p4d-efa", "xe8545-a100"]
NUMBER_FIELDS = ("hbm_bytes", "hbm_bw_Bps", "sms", "nvlink_bw_Bps", "tdp_w")


def _sources(node) -> list[str]:
    """Every `source:` value in a parsed YAML subtree."""
    if isinstance(node, dict):
        own = [node["source"]] if isinstance(node.get("source"), str) else []
        return own + [s for v in node.values() for s in _sources(v)]
    if isinstance(node, list):
        return [s for v in node for s in _sources(v)]
    return []


@pytest.mark.parametrize("name", A100S)
def test_entries_load_with_a_resolved_source_for_every_number(name):
    spec = get_gpu(name)
    assert sorted(spec.sources) == sorted([f"peak_flops.{d}" for d in spec.peak_flops] + list(NUMBER_FIELDS))
    assert all(s.startswith(("NVIDIA A100", "MLPerf")) for s in spec.sources.values()), spec.sources
    data = load_yaml("gpus.yaml")
    assert set(_sources(data["gpus"][name])) <= set(data["references"])


def test_datasheet_numbers_and_no_fp8_on_ampere():
    for name, hbm, bw in (("a100-40gb", 40e9, 1.555e12), ("a100-80gb", 80e9, 2.039e12)):
        s = get_gpu(name)
        assert s.peak_flops == {"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12}
        assert (s.hbm_bytes, s.hbm_bw_Bps, s.sms, s.nvlink_bw_Bps, s.tdp_w) == (hbm, bw, 108, 300e9, 400)
    assert "500 W" in get_gpu("a100-80gb").notes["tdp_w"]
    with pytest.raises(ValueError) as e:
        get_gpu("a100-80gb").peak("fp8")
    assert str(e.value) == ("GPU 'a100-80gb' has no peak for dtype 'fp8' (not in the catalog for this GPU); "
                            "use one of: fp32, tf32, bf16")


@pytest.mark.parametrize(("device", "entry"), [
    ("NVIDIA A100-SXM4-40GB", "a100-40gb"), ("A100-SXM4-40GB", "a100-40gb"),
    ("NVIDIA A100-SXM4-80GB", "a100-80gb"), ("NVIDIA A100-SXM-80GB", "a100-80gb"),
])  # fmt: skip
def test_torch_device_names_map_to_the_entries(device, entry):
    assert catalog_name("cuda", device) == entry


def test_ampere_curves_cite_known_references_and_match_the_published_kernels():
    data = load_yaml("efficiency.yaml")
    assert set(_sources(data["families"]["ampere"])) <= set(data["references"])
    assert {family_name(g) for g in A100S} == {"ampere"}
    assert all(r.source for g in A100S for r in efficiency_table(g))
    a100 = get_gpu("a100-80gb")
    gemm = lambda n: 2 * n**3 / kernel_cost(kind="gemm", flops=2 * n**3, bytes=0, gpu=a100, dtype="bf16").time_s  # noqa: E731
    assert gemm(8192) == pytest.approx(253.7e12, rel=0.05)  # cuBLASLt, azure-a100
    assert gemm(4096) == pytest.approx(228.0e12, rel=0.055)
    copy = 2 * 2**28 / kernel_cost(kind="elementwise", flops=0, bytes=2 * 2**28, gpu=a100, dtype="bf16").time_s
    assert copy == pytest.approx(1.61e12, rel=0.03)  # BabelStream Copy


@pytest.mark.parametrize("name", A100_NETWORKS)
def test_a100_presets_cite_known_references(name):
    net, refs = get_network(name), load_yaml("networks.yaml")["references"]
    for tier in net.tiers:
        assert set(tier.sources) <= set(refs) and all(len(net.sources[s]) > 10 for s in tier.sources)


def _busbw(net: str, kind: str, msg_bytes: float, n: int) -> float:
    cost = collective_cost(kind=kind, msg_bytes=msg_bytes, group_size=n, network=get_network(net))
    return bus_factor(kind, n) * msg_bytes / cost.time_s


@pytest.mark.parametrize(("net", "n", "msg_bytes", "busbw_GBps"), [
    ("dgx-a100-hdr", 8, 2**30, 228.10),  # azure-a100-nccl, 8x A100 80GB on NVSwitch
    ("dgx-a100-hdr", 8, 2**33, 231.58),
    ("dgx-a100-hdr", 8, 2**24, 109.22),
    ("p4d-efa", 8, 2**30, 230.77),       # p4d-nccl: one p4d.24xlarge
    ("p4d-efa", 24, 2**30, 31.77),       # three instances over EFA
    ("p4d-efa", 32, 2**30, 29.61),       # four
])  # fmt: skip
def test_all_reduce_prices_at_the_cited_bus_bandwidth(net, n, msg_bytes, busbw_GBps):
    assert _busbw(net, "all_reduce", msg_bytes, n) == pytest.approx(busbw_GBps * 1e9, rel=0.02)


def test_a100_fabric_shapes():
    assert get_network("dgx-a100-hdr").tier_for_group(group_size=112).name == "leaf"  # MLPerf's 14 nodes
    assert get_network("dgx-a100-hdr").max_gpus == 1120
    assert all(t.nvls_efficiency is None for n in A100_NETWORKS for t in get_network(n).tiers)  # no NVLS on A100
    # one NV4 pair of the XE8545 carries at most the 72 GB/s a pair measured, not the GPU's 300
    assert _busbw("xe8545-a100", "send_recv", 2**30, 2) <= 72e9


@pytest.mark.parametrize(("overrides", "message"), [
    (["precision.mlp=mxfp8"], "precision.mlp = 'mxfp8': GPU 'a100-80gb' has no mxfp8 peak (its dtypes: fp32, tf32, "
     "bf16); set precision.mlp=bf16"),
    (["precision.attention=mxfp8"], "precision.attention = 'mxfp8': GPU 'a100-80gb' has no mxfp8 peak (its dtypes: "
     "fp32, tf32, bf16); set precision.attention=bf16"),
    (["hardware.mfu_peak_dtype=mxfp8"], "hardware.mfu_peak_dtype = 'mxfp8': GPU 'a100-80gb' has no fp8 peak (its "
     "dtypes: fp32, tf32, bf16); set hardware.mfu_peak_dtype=bf16"),
])  # fmt: skip
def test_fp8_on_an_a100_is_a_one_line_error(overrides, message):
    s = scenarios.load("dlrm-dcnv2", ["hardware.gpu=a100-80gb", "hardware.network=dgx-a100-hdr", *overrides])
    with pytest.raises(ValueError) as e:
        Hardware.of(s)
    assert str(e.value) == message
    assert Hardware.of(scenarios.load("dlrm-dcnv2", ["hardware.gpu=a100-80gb", "hardware.network=dgx-a100-hdr"]))


def test_cli_hw_show_and_the_fp8_error():
    runner = CliRunner()
    r = runner.invoke(app, ["hw", "show", "a100-80gb"])
    assert r.exit_code == 0, r.output
    assert "a100-80gb" in r.output and "312.00 TFLOP/s" in r.output and "gemm" in r.output
    r = runner.invoke(app, ["simulate", "dlrm-dcnv2", "--set", "hardware.gpu=a100-40gb",
                            "--set", "hardware.network=p4d-efa", "--set", "precision.mlp=mxfp8"])
    assert r.exit_code == 2 and r.output.strip().count("\n") == 0, r.output
    assert "precision.mlp = 'mxfp8': GPU 'a100-40gb' has no mxfp8 peak" in r.output
