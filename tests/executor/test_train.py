"""debug-cpu trains (falling loss, AUC > 0.6) and writes a RunRecord the twin can read back."""

import itertools
import math

import pytest
import torch

import scenarios
from executor.metrics import auc, normalized_entropy
from executor.optim import RowWiseAdagrad
from executor.train import train
from twin.runrecord import OP_CLASSES, load_run


@pytest.fixture(scope="module")
def debug_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "run.json"
    return train(scenarios.load("debug-cpu"), out=out, log=lambda _: None), out


def test_debug_cpu_learns(debug_run):
    """Loss falls and held-out AUC / NE beat chance. How long it takes is the machine's business
    (a loaded 2-core CI box takes twice as long): the RunRecord's step times report it."""
    record, _ = debug_run
    losses = [s.loss for s in record.steps]
    assert len(losses) == 60 and all(math.isfinite(x) for x in losses)
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.02
    for task in ("click", "conversion"):
        assert record.metrics[f"auc_{task}"] > 0.6
        assert record.metrics[f"ne_{task}"] < 0.97
    assert record.model_flops_per_step < 2e9  # stays a toy (0.66 GFLOP): what keeps the suite quick


def test_run_record_round_trips(debug_run):
    record, out = debug_run
    loaded = load_run(out)
    assert loaded == record
    assert loaded.scenario_name == "debug-cpu" and loaded.environment.device in ("cpu", "cuda")
    assert loaded.environment.torch == torch.__version__ and loaded.environment.cpu_threads > 0
    assert loaded.step_time_s > 0 and loaded.profiled_steps == 3 and loaded.warmup_steps == 2
    assert {"first_loss", "loss"} <= set(loaded.metrics)
    assert loaded.step_timer == "host_clock" and loaded.embedding_kernel == "torch"
    assert all(s.wall_time_s == s.step_time_s and s.data_wait_s >= 0 for s in loaded.steps)
    assert loaded.peak_memory_bytes > 0 and loaded.mfu_peak_flops_per_s is None


def test_model_flops_and_op_classes(debug_run):
    record, _ = debug_run
    assert all(s.model_flops > 1e8 for s in record.steps)  # twin.flops wired
    assert record.achieved_flops_per_s == pytest.approx(record.model_flops_per_step / record.step_time_s)
    assert set(record.op_class_time_s) == set(OP_CLASSES)
    for cls in ("gemm", "attention", "embedding", "norm", "optimizer", "elementwise"):
        assert record.op_class_time_s[cls] > 0, cls
    assert record.mfu is None or record.environment.device == "cuda"


def test_tiny_dlrm_trains(tiny_dlrm, tmp_path):
    record = train(tiny_dlrm("dot"), steps=4, out=tmp_path / "dlrm.json", profile_steps=1, warmup_steps=1,
                   log=lambda _: None)
    assert len(record.steps) == 4 and all(math.isfinite(s.loss) for s in record.steps)
    assert load_run(tmp_path / "dlrm.json").metrics["auc_click"] == record.metrics["auc_click"]


# ---- pieces --------------------------------------------------------------------------------------
def test_auc_is_the_pairwise_probability_with_half_ties():
    scores = torch.tensor([0.1, 0.4, 0.4, 0.8, 0.3, 0.4, 0.9])
    labels = torch.tensor([0, 1, 0, 1, 0, 1, 1])
    pos = [s for s, y in zip(scores.tolist(), labels.tolist()) if y]
    neg = [s for s, y in zip(scores.tolist(), labels.tolist()) if not y]
    brute = sum((p > n) + 0.5 * (p == n) for p, n in itertools.product(pos, neg)) / (len(pos) * len(neg))
    assert auc(scores, labels) == pytest.approx(brute)
    assert math.isnan(auc(scores, torch.ones(7)))


def test_ne_of_the_base_rate_is_one():
    labels = torch.tensor([1.0, 0, 0, 0])
    assert normalized_entropy(torch.full((4,), math.log(0.25 / 0.75)), labels) == pytest.approx(1.0)


def test_rowwise_adagrad_updates_only_touched_rows():
    emb = torch.nn.Embedding(5, 3, sparse=True)
    w0 = emb.weight.detach().clone()
    opt = RowWiseAdagrad(emb.parameters(), lr=0.1)
    (emb(torch.tensor([1, 3, 3])) * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    opt.step()
    g = torch.tensor([1.0, 2.0, 3.0])
    for row, grad in ((1, g), (3, 2 * g)):
        s = grad.square().mean()
        torch.testing.assert_close(emb.weight[row].detach(), w0[row] - 0.1 * grad / (s.sqrt() + 1e-8))
    for row in (0, 2, 4):
        assert torch.equal(emb.weight[row].detach(), w0[row])
    torch.testing.assert_close(opt.state[emb.weight]["sum"][3], (2 * g).square().mean())


def test_committed_h200_records_still_load():
    """New RunRecord fields have defaults: the first committed H200 runs (the round trip's) load."""
    from pathlib import Path

    runs = sorted((Path(__file__).parents[2] / "hwmodels/data/runs/h200-2026-11-30-roundtrip").glob("*.json"))
    assert len(runs) == 3
    for path in runs:
        r = load_run(path)
        assert r.environment.device == "cuda" and r.step_timer == "" and r.steps[0].data_wait_s == 0.0


@pytest.mark.gpu
def test_gpu_run_record_is_complete(tmp_path):
    record = train(scenarios.load("debug-cpu"), steps=4, out=tmp_path / "gpu.json", profile_steps=1,
                   warmup_steps=1, log=lambda _: None)
    env = record.environment
    assert env.device == "cuda" and env.device_name and env.driver and env.cuda and env.torch and env.triton
    assert env.nccl and env.device_capability and env.device_memory_bytes > 0
    assert record.step_timer == "cuda_events" and record.embedding_kernel == "triton"
    assert all(s.wall_time_s >= s.step_time_s * 0.5 for s in record.steps)
    assert record.mfu is not None and record.mfu_peak == "h200 fp32 dense"  # debug-cpu names the fp32 peak
    assert record.mfu == pytest.approx(record.achieved_flops_per_s / record.mfu_peak_flops_per_s)
    assert record.peak_memory_bytes > 0 and record.peak_memory_reserved_bytes >= record.peak_memory_bytes
    assert load_run(tmp_path / "gpu.json") == record


def test_fused_sparse_update_trains_like_the_optimizer_step():
    """Row-wise Adagrad inside the Triton lookups' backward (the CUDA default, here under the
    interpreter) gives the losses of sparse gradients + ``RowWiseAdagrad.step``."""
    base = ["training.micro_batch=4", "training.global_batch=4", "execution.embedding_kernel=triton"]
    if torch.cuda.is_available():
        pytest.skip("runs the Triton lookups on CPU tensors: the interpreter is off where CUDA is present")
    runs = {fused: train(scenarios.load("debug-cpu", [*base, f"execution.fused_sparse_update={fused}"]), steps=3,
                         profile_steps=0, log=lambda *_: None) for fused in (False, True)}  # fmt: skip
    assert [runs[f].sparse_update for f in (False, True)] == ["optimizer_step", "fused_backward"]
    losses = {f: [st.loss for st in r.steps] for f, r in runs.items()}
    assert losses[True] == pytest.approx(losses[False], rel=1e-5)
    assert losses[False][0] != losses[False][-1]  # the tables (and the rest) did train
    assert runs[True].metrics["loss"] == pytest.approx(runs[False].metrics["loss"], rel=1e-5)
    with pytest.raises(ValueError, match="one micro-batch per step"):
        train(scenarios.load("debug-cpu", ["training.micro_batch=2", "training.global_batch=4",
                                           "execution.embedding_kernel=triton", "execution.fused_sparse_update=true"]),
              steps=1, log=lambda *_: None)


def test_static_shape_batches_and_worker_process_train_the_same():
    """Static-shape batches (id layouts padded to a bucket, what CUDA graphs need) drawn in a
    worker process change neither the losses nor the record's metrics, and the record says
    they were on. The Triton lookups (interpreted on CPU) read the padded layouts."""
    base = ["training.micro_batch=16", "training.global_batch=16", "execution.embedding_kernel=triton"]
    runs = [train(scenarios.load("debug-cpu", [*base, *kw]), steps=3, profile_steps=0, log=lambda *_: None)
            for kw in ([], ["execution.token_bucket=64", "execution.data_processes=true"])]  # fmt: skip
    assert [r.token_bucket for r in runs] == [0, 64] and [r.data_processes for r in runs] == [False, True]
    assert [st.loss for st in runs[1].steps] == pytest.approx([st.loss for st in runs[0].steps], rel=1e-5)
    assert runs[1].metrics["loss"] == pytest.approx(runs[0].metrics["loss"], rel=1e-5)
    assert not runs[1].cuda_graphs and runs[1].graph_replays == 0


def test_cuda_graphs_where_they_cannot_run_is_a_one_line_error():
    s = scenarios.load("debug-cpu", ["training.micro_batch=8", "training.global_batch=8",
                                     "execution.cuda_graphs=true", "execution.attention_kernel=reference"])
    want = "they need CUDA" if not torch.cuda.is_available() else "they need the Triton attention"
    with pytest.raises(ValueError, match=f"^execution.cuda_graphs: {want}.*; set it to auto or false$"):
        train(s, steps=1, log=lambda *_: None)


@pytest.mark.gpu
def test_cuda_graph_steps_train_like_eager_steps():
    """On CUDA, steps replayed from CUDA graphs give the eager steps' losses (same static-shape
    batches), and most steps are replays."""
    base = ["training.micro_batch=64", "training.global_batch=64", "precision.mlp=bf16", "precision.attention=bf16",
            "execution.token_bucket=256", "execution.compile=false"]
    runs = {g: train(scenarios.load("debug-cpu", [*base, f"execution.cuda_graphs={g}"]), steps=12, profile_steps=0,
                     log=lambda *_: None) for g in (False, True)}  # fmt: skip
    assert runs[True].cuda_graphs and runs[True].graph_replays >= 6 and not runs[False].cuda_graphs
    losses = {g: [st.loss for st in r.steps] for g, r in runs.items()}
    assert losses[True] == pytest.approx(losses[False], rel=2e-2)
    assert runs[True].metrics["loss"] == pytest.approx(runs[False].metrics["loss"], rel=2e-2)


@pytest.mark.parametrize("on_device", [False, True])
def test_dense_learning_rate_warms_up_linearly(on_device):
    """``training.lr_warmup_steps``: step i uses dense_lr·min(1, (i+1)/warmup); as a tensor updated
    in place when CUDA graphs read it (here on the CPU), as a float otherwise."""
    from executor.runtime import Warmup as _Warmup

    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(3))], lr=0.5)
    warm = _Warmup(opt, 0.5, 4, torch.device("cpu") if on_device else None)
    seen = []
    for step in range(6):
        warm.set(step)
        seen.append(float(opt.param_groups[0]["lr"]))
    assert seen == pytest.approx([0.125, 0.25, 0.375, 0.5, 0.5, 0.5])
    assert isinstance(opt.param_groups[0]["lr"], torch.Tensor) == on_device
    s = scenarios.load("debug-cpu", ["training.micro_batch=8", "training.global_batch=8", "training.lr_warmup_steps=3"])
    assert s.training.lr_warmup_steps == 3 and train(s, steps=2, profile_steps=0, log=lambda *_: None).steps


def test_graphed_steps_capture_once_per_shape_and_replay_with_the_new_batch(monkeypatch):
    """``GraphedSteps`` bookkeeping, on CPU with a stand-in for CUDA graphs (a "graph" re-runs
    what was captured on its static inputs): the first batch of a shape runs eagerly and is
    captured; a later batch of that shape is copied into the static inputs and replayed; past
    ``max_graphs`` shapes, new shapes run eagerly."""
    import contextlib

    from executor import graphs as G
    from executor.data import SyntheticData

    class FakeGraph:
        def replay(self):
            self.run()

        def pool(self):
            return "pool"

    capturing = []

    @contextlib.contextmanager
    def fake_capture(graph, pool=None, capture_error_mode="global"):
        # thread_local: the data loader's thread must not be able to invalidate the capture
        assert capture_error_mode == "thread_local"
        capturing.append(graph)
        yield
        capturing.pop()

    monkeypatch.setattr(G.torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(G.torch.cuda, "graph", fake_capture)
    monkeypatch.setattr(G.torch.cuda, "synchronize", lambda *a: None)
    calls = []

    def step(batches):
        b = batches[0]
        if capturing:  # record what the graph would replay: this step on these (static) inputs
            capturing[-1].run = lambda b=b: calls.append(("replay", float(b.dense.sum())))
            return torch.zeros(())
        calls.append(("eager", float(b.dense.sum())))
        return torch.zeros(())

    s = scenarios.load("debug-cpu", ["training.micro_batch=8", "training.global_batch=8"])
    data = SyntheticData(s, 0)
    model = torch.nn.Module()
    model.autocast_cache = True
    steps = G.GraphedSteps(model, step, max_graphs=1)
    assert model.autocast_cache is False
    a1, a2 = (next(data).pack(s.model, bucket=64) for _ in range(2))  # one shape (same bucket)
    b = next(data).pack(s.model, bucket=128)  # another shape
    assert G.shape_key(a1) == G.shape_key(a2) != G.shape_key(b)
    for batch in (a1, a2, b, b):
        steps(batch)
    assert calls == [("eager", float(a1.dense.sum())), ("replay", float(a2.dense.sum())),
                     ("eager", float(b.dense.sum())), ("eager", float(b.dense.sum()))]
    assert steps.summary() == {"graphs": 1, "replays": 1, "eager_steps": 3}


def test_execution_switches_take_true_false_or_auto_and_nothing_else():
    """``execution.compile`` and ``execution.cuda_graphs`` take true/false (YAML's yes/no/on/off
    too) or auto; anything else is a one-line error naming the field."""
    from scenarios.execution import resolve

    for value, want in (("true", True), ("yes", True), ("off", False), ("false", False), ("auto", "auto")):
        s = scenarios.load("debug-cpu", [f"execution.cuda_graphs={value}", f"execution.compile={value}"])
        assert s.execution.cuda_graphs == want and s.execution.compile == want
    assert resolve(scenarios.load("debug-cpu"), "cpu").compile is False  # auto: off on CPU
    assert resolve(scenarios.load("debug-cpu"), "cuda").compile is True  # auto: on with CUDA
    with pytest.raises(ValueError, match=r"^execution.compile: input should be a valid boolean"):
        scenarios.load("debug-cpu", ["execution.compile=maybe"])


def test_train_command_says_which_loss_is_which_and_prints_held_out_auc_ne(tmp_path, capfd):
    from typer.testing import CliRunner

    from twin.cli import app

    r = CliRunner().invoke(app, ["train", "debug-cpu", "--steps", "3", "--out", str(tmp_path / "r.json")])
    assert r.exit_code == 0, r.output
    record = load_run(tmp_path / "r.json")
    m, lines = record.metrics, r.output.strip().splitlines()
    assert lines[-2].startswith("step_time_s=")
    assert lines[-1] == (
        f"training loss {m['first_loss']:.4f} (step 0) -> {record.steps[-1].loss:.4f} (step 2); held-out "
        f"(1,024 samples) loss {m['loss']:.4f}, click AUC {m['auc_click']:.3f} NE {m['ne_click']:.3f}, "
        f"conversion AUC {m['auc_conversion']:.3f} NE {m['ne_conversion']:.3f}; wrote {tmp_path / 'r.json'}"
    )
    assert "USDT" not in capfd.readouterr().err  # libkineto's notices, written to fd 2
