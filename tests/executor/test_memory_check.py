"""The memory check before training: what does not fit is refused in one line (needed, usable,
the largest categories, a fix) before anything is allocated; an allocation that fails anyway
ends in one line too, and the CLI exits 2 on both, without a traceback."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

import executor.memory_check as memory_check
import executor.train as train_module
import scenarios
from executor.memory_check import (
    CPU_MARGIN, DoesNotFit, check_fits, host_available_bytes, memory_errors_in_one_line, one_process,
    smaller_micro_batches,
)
from executor.train import train
from twin.cli import app
from twin.memory import memory_per_rank

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
# gem-h200-1gpu with toy tables: its 17.6 GB of activations at micro_batch 256 dominate
SMALL_TABLES = ["model.embeddings.pooled.0.rows=1000", "model.embeddings.pooled.1.rows=1000",
                "model.embeddings.sequences.0.tables.0.rows=1000"]  # fmt: skip


def _need(s, micro_batch: int) -> float:
    t = s.training.model_copy(update={"micro_batch": micro_batch})
    return memory_per_rank(one_process(s.model_copy(update={"training": t}))).total_bytes


def test_what_fits_passes_and_returns_the_report():
    s = scenarios.load("debug-cpu")
    assert check_fits(s, CPU, free_bytes=64e9).total_bytes == memory_per_rank(s).total_bytes


def test_refusal_names_need_usable_largest_and_the_largest_micro_batch_that_fits():
    s = scenarios.load("gem-h200-1gpu", SMALL_TABLES)
    with pytest.raises(DoesNotFit) as e:
        check_fits(s, CPU, free_bytes=8e9)
    assert str(e.value) == (
        "gem-h200-1gpu does not fit in this host's RAM: the twin's memory model needs 21.3 GB "
        "(activations 17.6 GB, workspace 1.07 GB, dense_optimizer 0.57 GB), 7.20 GB usable "
        "(MemAvailable 8.00 GB less a 10% margin); try --set training.micro_batch=32 (5.81 GB), "
        "or the debug-cpu scenario"
    )
    assert _need(s, 32) <= 8e9 * (1 - CPU_MARGIN) < _need(s, 64)
    assert isinstance(e.value, ValueError)  # what the CLI prints as one line, exit 2


def test_when_no_micro_batch_fits_it_points_to_debug_cpu():
    with pytest.raises(DoesNotFit, match=r"needs 56\.4 GB \(embedding_shard 34\.8 GB, activations 17\.6 GB, "
                                         r"workspace 1\.07 GB\), 21\.6 GB usable .*; even training\.micro_batch=1 "
                                         r"needs 38\.7 GB \(largest: embedding_shard\): use the debug-cpu scenario "
                                         r"here, or smaller model\.embeddings tables$"):  # fmt: skip
        check_fits(scenarios.load("gem-h200-1gpu"), CPU, free_bytes=24e9)
    with pytest.raises(DoesNotFit, match=r"; even training\.micro_batch=1 needs 1\.08 GB \(largest: workspace\): "
                                         r"free memory on this machine \(debug-cpu is the smallest bundled scenario\)$"):
        check_fits(scenarios.load("debug-cpu"), CPU, free_bytes=0.5e9)


def test_cuda_free_memory_is_used_whole_and_cpu_keeps_a_margin():
    s = scenarios.load("gem-h200-1gpu", SMALL_TABLES)
    need = _need(s, 256)
    check_fits(s, CUDA, free_bytes=need)  # the model's 1 GiB workspace is the CUDA headroom
    check_fits(s, CPU, free_bytes=need / (1 - CPU_MARGIN))
    with pytest.raises(DoesNotFit, match=r"^gem-h200-1gpu does not fit in this host's RAM"):
        check_fits(s, CPU, free_bytes=need)
    with pytest.raises(DoesNotFit, match=r"^gem-h200-1gpu does not fit on cuda: .* \(free on the device\); "):
        check_fits(s, CUDA, free_bytes=need - 1)


def test_one_process_holds_what_the_ranks_share():
    """The executor trains a 2-GPU scenario in one process: it needs the whole model, not a rank's."""
    s = scenarios.load("gem-h200-2gpu")
    per_rank, whole = memory_per_rank(s).total_bytes, memory_per_rank(one_process(s)).total_bytes
    assert per_rank < whole
    with pytest.raises(DoesNotFit):
        check_fits(s, CUDA, free_bytes=(per_rank + whole) / 2)


def test_smaller_micro_batches_keep_the_global_batch_divisible():
    assert smaller_micro_batches(256) == [128, 64, 32, 16, 8, 4, 2, 1]
    assert smaller_micro_batches(96) == [48, 24, 12, 6, 3, 1]
    assert smaller_micro_batches(5) == [1] and smaller_micro_batches(1) == []


def test_host_available_bytes_reads_memavailable(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       25165824 kB\nMemFree:          123456 kB\nMemAvailable:   23878800 kB\n")
    assert host_available_bytes(meminfo) == 23878800 * 1024
    assert host_available_bytes(tmp_path / "missing") > 0  # the free pages, from sysconf


def _never_build(*_, **__):
    raise AssertionError("the model was built")  # rather than a test that allocates for real


def test_train_refuses_before_allocating(monkeypatch, tmp_path):
    monkeypatch.setattr(train_module, "build_model", _never_build)
    monkeypatch.setattr(memory_check, "device_free_bytes", lambda device: 0.5e9)
    with pytest.raises(DoesNotFit, match=r"^debug-cpu does not fit in this host's RAM: .* 0\.45 GB usable"):
        train(scenarios.load("debug-cpu"), out=tmp_path / "r.json", log=lambda _: None)
    assert not (tmp_path / "r.json").exists()


def _allocate_an_exabyte(*_, **__):
    return torch.empty(2**60, dtype=torch.uint8)  # fails at once: more than any address space


def test_a_failing_allocation_is_one_line():
    fails = memory_errors_in_one_line(lambda scenario: _allocate_an_exabyte())
    with pytest.raises(DoesNotFit) as e:
        fails(scenarios.load("debug-cpu"))
    assert str(e.value) == (
        "debug-cpu ran out of memory (DefaultCPUAllocator: can't allocate memory: you tried to allocate "
        "1152921504606846976 bytes. Error code 12 (Cannot allocate memory)) although the twin's memory "
        "model puts it at 1.10 GB; try a smaller --set training.micro_batch=64, or free memory on this "
        "machine (debug-cpu is the smallest bundled scenario)"
    )
    assert isinstance(e.value.__cause__, RuntimeError)


def test_cuda_out_of_memory_is_cut_to_its_first_sentences():
    def fails(scenario):
        raise torch.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 139.81 GiB of "
            "which 3.19 GiB is free.\nOf the allocated memory 120.3 GiB is allocated by PyTorch. If reserved "
            "but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    s = scenarios.load("gem-h200-1gpu")
    with pytest.raises(DoesNotFit, match=r"^gem-h200-1gpu ran out of memory \(CUDA out of memory\. Tried to "
                                         r"allocate 20\.00 GiB\.\) although the twin's memory model puts it at "
                                         r"56\.4 GB; try a smaller --set training\.micro_batch=128, or the "
                                         r"debug-cpu scenario here, or a smaller model$"):  # fmt: skip
        memory_errors_in_one_line(fails)(s)


def test_other_errors_pass_unchanged():
    def fails(scenario):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    with pytest.raises(RuntimeError, match="^mat1 and mat2"):
        memory_errors_in_one_line(fails)(scenarios.load("debug-cpu"))


def _one_error_line(r) -> str:
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    return lines[0]


def test_cli_refuses_what_does_not_fit_in_one_line(monkeypatch, tmp_path):
    """84 TB of activations (micro_batch 2^20): no machine holds that, so this refuses everywhere."""
    monkeypatch.setattr(train_module, "build_model", _never_build)
    out = tmp_path / "r.json"
    r = CliRunner().invoke(app, ["train", "gem-h200-1gpu", "--set", "training.global_batch=1048576",
                                 "--set", "training.micro_batch=1048576", "--out", str(out)])  # fmt: skip
    line = _one_error_line(r)
    assert line.startswith("error: gem-h200-1gpu does not fit ") and "the twin's memory model needs" in line
    assert not out.exists()


def test_cli_reports_a_failing_allocation_in_one_line(monkeypatch, tmp_path):
    monkeypatch.setattr(train_module, "build_model", _allocate_an_exabyte)
    line = _one_error_line(CliRunner().invoke(app, ["train", "debug-cpu", "--out", str(tmp_path / "r.json")]))
    assert line.startswith("error: debug-cpu ran out of memory (DefaultCPUAllocator: can't allocate memory: ")
