"""Checkpoints of a training run, through ``torch.distributed.checkpoint`` (DCP), and resuming
from them, at the same mesh or another.

What a checkpoint holds (``training.checkpoint``; one directory ``step-NNNNNNNN`` per save, N
the steps trained):

- the dense parameters and the dense optimizer's state (AdamW/Adam), as DCP's state-dict API
  gives them (``get_state_dict``: FSDP2's DTensors, which DCP reshards on load to any mesh); the
  expert-parallel experts, which each rank of an ``expert`` group holds different ones of, under
  keys of their own (``<fqn>@e<position>``);
- the embedding tables and their row-wise Adagrad sums: a sharded table as its shards, one key
  per (shard, replica) (``<fqn>@s<shard>r<replica>``, its sums ``….sum``), a whole one under its
  name; the layout they were cut by goes in ``meta.json``, so that a run at another mesh
  rebuilds the tables whole from the shards and cuts its own (``_rebuild``);
- each rank's RNG states and data position (``rank<k>.*``; the position is also global: the
  micro-batches of the one stream consumed, ``executor.data.SyntheticData``), and the step.

A save is atomic: DCP writes into ``step-N.partial`` (its files fsynced), then rank 0 writes
``meta.json`` (the marker: a directory without it was never committed), fsyncs it, renames the
directory to ``step-N`` and fsyncs the parent. A crash at any moment leaves at worst a
``.partial`` directory, which ``find_latest`` skips and reports. After a commit the oldest
committed checkpoints past ``keep`` are deleted. With ``async`` the step blocks only while DCP
copies the state to host memory (its stager); the files are written on a background thread over
a gloo group of their own, and the commit happens at the next step boundary after it is done
(``poll``), or at the end (``finish``).

A change of the expert-parallel degree regroups the experts (``_regroup_experts``). The torchrec
backend's tables are saved whole by rank 0 (TorchRec's shards gathered over its group, their
Adagrad sums as FBGEMM keeps them, ``[column blocks, rows]``) and cut again by TorchRec's plan on
load, at any mesh; a checkpoint loads only into the backend that saved it (its sums differ).
"""

from __future__ import annotations

import json
import os
import shutil
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor

from scenarios.files import fsync_dir, write_text_atomic
from scenarios.schema import Scenario

FORMAT = 1
MARKER = "meta.json"
PARTIAL = ".partial"


class CheckpointError(ValueError):
    """A checkpoint that cannot be used as asked (one line: what, where, the fix)."""


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / f"step-{step:08d}"


def _step_of(p: Path) -> int | None:
    name = p.name.removesuffix(PARTIAL)
    if not name.startswith("step-"):
        return None
    try:
        return int(name[5:])
    except ValueError:
        return None


@dataclass(frozen=True)
class Found:
    """What ``find_latest`` found under a checkpoint directory."""

    latest: Path | None  # the newest committed checkpoint
    committed: list[Path] = field(default_factory=list)  # oldest first
    torn: list[Path] = field(default_factory=list)  # saves that never committed (a crash during the save)


def find_latest(root: str | os.PathLike) -> Found:
    """The committed checkpoints under ``root`` and the torn ones (``.partial`` directories, or a
    step directory without its ``meta.json`` marker)."""
    root = Path(root)
    committed, torn = [], []
    for p in sorted(root.glob("step-*")) if root.is_dir() else ():
        step = _step_of(p)
        if step is None or not p.is_dir():
            continue
        if p.name.endswith(PARTIAL) or not (p / MARKER).is_file():
            torn.append(p)
        else:
            committed.append(p)
    committed.sort(key=_step_of)
    return Found(committed[-1] if committed else None, committed, torn)


def read_meta(path: Path) -> dict:
    try:
        return json.loads((Path(path) / MARKER).read_text())
    except FileNotFoundError:
        raise CheckpointError(f"--resume-from {path}: no committed checkpoint there (no {MARKER}); give a "
                              "step-NNNNNNNN directory of training.checkpoint.dir") from None  # fmt: skip
    except json.JSONDecodeError as e:
        raise CheckpointError(f"--resume-from {path}: {MARKER} is not JSON ({e.msg}); the checkpoint is damaged, "
                              "resume from an older one") from None  # fmt: skip


def resolve_resume(scenario: Scenario, resume: str | os.PathLike | bool | None) -> Path | None:
    """The checkpoint to resume from: ``True`` (or "latest") the newest committed one under
    ``training.checkpoint.dir`` (None when there is none yet: the run starts fresh), a path that
    checkpoint, None no resume. Bad input is one ``CheckpointError`` line."""
    if resume is None or resume is False:
        return None
    if resume is True or resume == "latest":
        root = scenario.training.checkpoint.dir
        if root is None:
            raise CheckpointError("--resume needs training.checkpoint.dir (where the checkpoints are); "
                                  "set it with --set training.checkpoint.dir=PATH, or give --resume-from PATH")
        return find_latest(root).latest
    path = Path(resume)
    if not path.is_dir():
        raise CheckpointError(f"--resume-from {path}: no such directory; give a step-NNNNNNNN directory "
                              "of training.checkpoint.dir")  # fmt: skip
    read_meta(path)
    return path


# ---- what one rank holds ----------------------------------------------------------------------
@dataclass
class _Table:
    """One embedding table as this rank holds it."""

    fqn: str
    weight: Tensor  # the whole table, or this rank's shard
    rows: int
    dim: int
    layout: object = None  # executor.table_layout.TableLayout when sharded
    key: str = ""  # the DCP key of what this rank holds ("" when it holds nothing)
    sum_get: object = None  # () -> the fp32 row-wise Adagrad sums of ``weight``'s rows
    sum_set: object = None  # (Tensor) -> None


class State:
    """The training state of one rank as checkpoints see it: the model, both optimizers, the
    table backend, this rank's place. ``Session`` builds it (``executor.train``)."""

    def __init__(self, scenario: Scenario, model, dense_opt, sparse_opt, ranks=None, experts=None, tables=None):
        self.scenario, self.model, self.dense_opt, self.sparse_opt = scenario, model, dense_opt, sparse_opt
        self.ranks, self.experts = ranks, experts
        self.native = next((t for t in tables or [] if hasattr(t, "place")), None)  # ShardedTables
        self.rank, self.world = (ranks.rank, ranks.size) if ranks else (0, 1)
        self.expert_pos = ranks.mesh["expert"].get_local_rank() if ranks and scenario.parallelism.expert > 1 else 0
        self.torchrec: dict[str, tuple[object, str]] = {}  # fqn -> (TorchrecPooled, table): TorchRec's tables
        self.tables = self._tables()

    # -- the tables
    def _tables(self) -> list[_Table]:
        from executor.embeddings import _FusedTableModule

        out = []
        for prefix, mod in self.model.named_modules():
            if not isinstance(mod, _FusedTableModule):
                continue
            lookups = mod.sharded
            if lookups is not None and hasattr(lookups, "dmp"):  # the torchrec backend's (tables handed over)
                for n in lookups.names:
                    self.torchrec[f"{prefix}.tables.{n}.weight" if prefix else f"tables.{n}.weight"] = (lookups, n)
                continue
            for n, t in mod.tables.items():
                fqn = f"{prefix}.tables.{n}.weight" if prefix else f"tables.{n}.weight"
                w = t.weight
                L = lookups.layouts[n] if lookups is not None and n in lookups.routed else None
                rows, dim = (L.rows, L.dim) if L is not None else tuple(w.shape)
                key = fqn
                if L is not None:
                    pl = lookups.place
                    key = f"{fqn}@s{pl.shard}r{pl.replica}" if w.numel() else ""
                get, put = self._sums(mod, n, w)
                out.append(_Table(fqn, w, rows, dim, L, key, get, put))
        return out

    def _sums(self, mod, name: str, w: Tensor):
        """Getter and setter of table ``name``'s row-wise Adagrad sums: the sparse optimizer's state,
        or (``execution.fused_sparse_update``) the slice of its buffer's in-backward state."""
        opt = self.sparse_opt
        for g, f in zip(mod.table_groups, mod.fused):
            if name in g.names and getattr(f, "in_backward", None) is not None:
                i = g.names.index(name)
                lo, hi = int(f.row_starts[i]), int(f.row_starts[i + 1])
                state = f.in_backward.state

                def get(state=state, lo=lo, hi=hi):
                    return state[lo:hi]

                def put(v, state=state, lo=lo, hi=hi):
                    state[lo:hi].copy_(v)

                return get, put

        def get():
            s = opt.state.get(w, {}).get("sum")
            return s if s is not None else torch.zeros(w.shape[0], dtype=torch.float32, device=w.device)

        def put(v):
            opt.state[w]["sum"] = v.to(device=w.device, dtype=torch.float32).clone()

        return get, put

    def table_meta(self) -> dict:
        out = {}
        for fqn, (trec, n) in self.torchrec.items():  # saved whole (TorchRec's shards gathered)
            rows, dim = trec.shapes[n]
            out[fqn] = {"whole": True, "rows": rows, "dim": dim, "backend": "torchrec", "blocks": trec.blocks[n]}
        for t in self.tables:
            if t.layout is None:
                out[t.fqn] = {"whole": True, "rows": t.rows, "dim": t.dim}
            else:
                pl = self.native.place
                out[t.fqn] = {"whole": False, "rows": t.rows, "dim": t.dim, "layout": _layout_json(t.layout),
                              "S": pl.S, "R": pl.R, "split": pl.split_replicas}  # fmt: skip
        return out

    # -- the dense part (DCP's state-dict API)
    def _dense(self) -> dict:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (DSD's notes on FSDP2 internals)
            msd, osd = get_state_dict(self.model, self.dense_opt,
                                      options=StateDictOptions(flatten_optimizer_state_dict=True))
        tables = {t.fqn for t in self.tables}
        msd = {k: v for k, v in msd.items() if k not in tables}
        out = {f"model.{k}": v for k, v in msd.items()}
        out.update({f"optim.{k}": v for k, v in osd.items()})
        if self.experts is not None:  # each expert position holds different experts: keys of their own
            names = self._expert_fqns()
            out = {(f"{k}@e{self.expert_pos}" if _names_param(k, names) else k): v for k, v in out.items()}
        return out

    def _expert_fqns(self) -> set[str]:
        """The experts' parameter names (``executor.moe.GroupedExperts``: experts along dim 0)."""
        from executor.moe import GroupedExperts

        return {f"{prefix}.{n}" for prefix, m in self.model.named_modules() if isinstance(m, GroupedExperts)
                for n, _ in m.named_parameters(recurse=False)}  # fmt: skip

    def _set_dense(self, loaded: dict) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        if self.experts is not None:
            suffix = f"@e{self.expert_pos}"
            loaded = {k.removesuffix(suffix): v for k, v in loaded.items()}
        msd = {k[6:]: v for k, v in loaded.items() if k.startswith("model.")}
        osd = {k[6:]: v for k, v in loaded.items() if k.startswith("optim.")}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            set_state_dict(self.model, self.dense_opt, model_state_dict=msd, optim_state_dict=osd,
                           options=StateDictOptions(flatten_optimizer_state_dict=True, strict=False))

    # -- this rank's own
    def _own(self, step: int, position: int) -> dict:
        r = f"rank{self.rank}"
        out = {f"{r}.rng_cpu": torch.get_rng_state(), f"{r}.data_position": torch.tensor(position + self.rank)}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            out[f"{r}.rng_cuda"] = torch.cuda.get_rng_state()
        out["step"] = torch.tensor(step)
        return out

    def to_save(self, step: int, position: int) -> dict:
        """Everything this rank writes (DCP's state dict)."""
        sd = self._dense()
        for t in self.tables:
            if t.key:
                sd[t.key] = t.weight.detach()
                sd[f"{t.key}.sum"] = t.sum_get()
        sd.update(self._torchrec_state())
        sd.update(self._own(step, position))
        return sd

    def _torchrec_state(self) -> dict:
        """TorchRec's tables whole and their Adagrad sums ``[blocks, rows]`` (collectives over its
        group, on every rank; rank 0 writes them: the format does not depend on the mesh)."""
        out, done = {}, {}
        for fqn, (trec, n) in self.torchrec.items():
            if id(trec) not in done:
                done[id(trec)] = (trec.full_tables(), trec.accumulators())
            if self.rank == 0:
                w, acc = done[id(trec)]
                out[fqn], out[f"{fqn}.sum"] = w[n], acc[n]
        return out


def _names_param(key: str, fqns: set[str]) -> bool:
    """Whether DCP key ``key`` (``model.<fqn>`` or ``optim.state.<fqn>.<state>``) is about one of ``fqns``."""
    if key.startswith("model."):
        return key[6:] in fqns
    if key.startswith("optim.state.") or key.startswith("optim.param_groups."):
        rest = key.split(".", 2)[2]
        return rest.rsplit(".", 1)[0] in fqns
    return False


def _layout_json(L) -> dict:
    d = asdict(L)
    d["grid"] = [list(r) for r in L.grid]
    return d


def _layout(d: dict):
    from executor.table_layout import TableLayout

    return TableLayout(**{**d, "grid": tuple(tuple(r) for r in d["grid"])})


# ---- saving -----------------------------------------------------------------------------------
class Checkpointer:
    """The saves of one run (``training.checkpoint``): ``due(step)``, ``save(step, position)``,
    ``poll()`` at each step boundary (commits a finished async save), ``finish()`` at the end."""

    def __init__(self, scenario: Scenario, state: State):
        self.settings = scenario.training.checkpoint
        self.root = Path(self.settings.dir) if self.settings.dir else None
        self.state, self.lead = state, state.rank == 0
        self.pending = None  # (future, step, partial dir, meta) of an async save in flight
        self.saved: list[int] = []  # the steps of committed saves
        self.stalls: list[float] = []  # seconds each save blocked the loop
        self._group = None
        self._stager = None
        if self.root is not None and self.lead:
            self.root.mkdir(parents=True, exist_ok=True)

    @property
    def on(self) -> bool:
        return self.root is not None

    def due(self, trained: int, last: int) -> bool:
        """Whether to save once ``trained`` steps are done (every ``every`` steps, and after the last)."""
        if not self.on:
            return False
        every = self.settings.every
        return trained == last or (every > 0 and trained % every == 0)

    def save(self, trained: int, position: int) -> float:
        """Save the state after ``trained`` steps (``position``: the global stream's micro-batches
        consumed); returns the seconds the loop was blocked."""
        start = time.perf_counter()
        self.wait()  # one save in flight at a time
        final = step_dir(self.root, trained)
        partial = final.with_name(final.name + PARTIAL)
        if self.lead:
            if partial.exists():
                shutil.rmtree(partial)
            partial.mkdir(parents=True)
        self._barrier()
        sd = self.state.to_save(trained, position)
        meta = self._meta(trained, position)
        import torch.distributed.checkpoint as dcp

        if self.settings.async_save:
            future = dcp.async_save(sd, checkpoint_id=str(partial), process_group=self._async_group(),
                                    no_dist=self.state.world == 1, async_stager=self._staging())  # fmt: skip
            self.pending = (future, trained, partial, meta)
        else:
            dcp.save(sd, checkpoint_id=str(partial), no_dist=self.state.world == 1)
            self._commit(trained, partial, meta)
        stall = time.perf_counter() - start
        self.stalls.append(stall)
        return stall

    def poll(self) -> None:
        """Commit an async save whose files are written (rank 0: DCP's coordinator, whose future
        ends once every rank's files and the metadata are written)."""
        if self.pending is not None and self.pending[0].done():
            self._finish_pending()

    def wait(self) -> None:
        if self.pending is not None:
            self.pending[0].result()
            self._finish_pending()

    def finish(self) -> None:
        self.wait()
        if self._stager is not None:
            self._stager.close()  # its pinned host buffers
            self._stager = None
        self._barrier()

    def _staging(self):
        """The async saves' stager, one for the run (``PinnedStager``)."""
        if self._stager is None:
            self._stager = PinnedStager()
        return self._stager

    def _finish_pending(self) -> None:
        future, trained, partial, meta = self.pending
        self.pending = None
        future.result()  # raises what the writer raised
        self._commit(trained, partial, meta)

    def _commit(self, trained: int, partial: Path, meta: dict) -> None:
        self.saved.append(trained)
        if not self.lead:
            return
        commit(partial, step_dir(self.root, trained), meta)
        self._prune()

    def _prune(self) -> None:
        found = find_latest(self.root)
        for old in found.committed[: -self.settings.keep]:
            shutil.rmtree(old, ignore_errors=True)
        newest = _step_of(found.latest) if found.latest else -1
        for torn in found.torn:  # leftovers of saves that crashed, older than a committed one
            if torn.name.endswith(PARTIAL) and (_step_of(torn) or 0) < newest:
                shutil.rmtree(torn, ignore_errors=True)

    def _meta(self, trained: int, position: int) -> dict:
        s, st = self.state.scenario, self.state
        p = s.parallelism
        return {"format": FORMAT, "step": trained, "data_position": position, "world": st.world,
                "scenario": s.name, "mesh": st.ranks.mesh.sizes() if st.ranks else {"world": 1},
                "expert": p.expert if st.ranks else 1, "sparse_strategy": p.sparse_strategy,
                "tables": st.table_meta(), "created_unix": time.time()}  # fmt: skip

    def _barrier(self) -> None:
        if self.state.world > 1:
            dist.barrier()

    def _async_group(self):
        if self.state.world == 1:
            return None
        if self._group is None:  # the background writer's collectives stay off the training group
            self._group = dist.new_group(backend="gloo")
        return self._group


class PinnedStager:
    """DCP's ``AsyncStager`` for our async saves: each tensor copied into a host buffer kept for the
    run (pinned, for a CUDA tensor, and copied without blocking, one synchronize at the end), so
    that only the first save allocates and later ones block for the copy alone; other values are
    deep-copied. DCP's own default allocates pageable memory at every save (the first 37 GB save of
    ``gem-h200-1gpu`` blocked 26 s that way), and its ``DefaultStager``, which can keep pinned
    buffers, failed on our second save in torch 2.11 (``KeyError: <class 'type'>`` in its
    deep copy). The copy runs in the loop's thread: the next step updates the tables in place (the
    fused sparse update is in its backward), so it must be done before that step starts."""

    should_synchronize_after_execute = False

    def __init__(self):
        self.buffers: dict[str, Tensor] = {}  # reused by the next save: one save in flight at a time

    def stage(self, state_dict: dict) -> dict:
        import copy

        from torch.distributed.tensor import DTensor

        out, cuda = {}, False
        for k, v in state_dict.items():
            if not isinstance(v, Tensor):
                out[k] = copy.deepcopy(v)
                continue
            local = v.to_local() if isinstance(v, DTensor) else v
            buf = self.buffers.get(k)
            if buf is None or buf.shape != local.shape or buf.dtype != local.dtype:
                buf = torch.empty(local.shape, dtype=local.dtype, pin_memory=local.is_cuda)
                self.buffers[k] = buf
            buf.copy_(local.detach(), non_blocking=local.is_cuda)
            cuda = cuda or local.is_cuda
            # a DTensor keeps its spec around the host copy (DCP reads its shard's place from it;
            # DTensor.from_local would move the copy back to the mesh's device)
            out[k] = DTensor(buf, v._spec, requires_grad=False) if isinstance(v, DTensor) else buf
        if cuda:
            torch.cuda.synchronize()
        return out

    def synchronize_staging(self) -> None:
        pass

    def close(self) -> None:
        self.buffers.clear()


def commit(partial: Path, final: Path, meta: dict) -> None:
    """Write the marker into ``partial`` (atomically, fsynced), rename it to ``final``, fsync the parent."""
    write_text_atomic(partial / MARKER, json.dumps(meta, indent=1))
    if final.exists():  # the same step saved again (a run repeated into the same directory)
        stale = final.with_name(final.name + ".stale")
        shutil.rmtree(stale, ignore_errors=True)
        os.replace(final, stale)
        os.replace(partial, final)
        shutil.rmtree(stale, ignore_errors=True)
    else:
        os.replace(partial, final)
    fsync_dir(final.parent)



# DCP warns that a single-process save or load runs without a process group, which is what a
# one-process run asks for; an async save warns from its writer thread, so the filter is global.
warnings.filterwarnings("ignore", message=".*assuming the intent is to (save|load) in a single process.*")


# ---- loading ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Loaded:
    path: Path
    step: int  # steps trained: the run continues at this step index
    data_position: int  # micro-batches of the global stream consumed
    same_mesh: bool


def load(path: str | os.PathLike, state: State) -> Loaded:
    """Load checkpoint ``path`` into ``state`` (a collective on every rank): the dense part
    resharded by DCP, the tables in place when this run cuts them as the saving run did, else
    rebuilt whole from the saved shards and cut again; RNG states when the world is the same."""
    import torch.distributed.checkpoint as dcp

    path = Path(path)
    meta = read_meta(path)
    s = state.scenario
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"--resume-from {path}: checkpoint format {meta.get('format')} is not {FORMAT}; "
                              "it was written by another version of gemtwin")  # fmt: skip
    mine = {t.fqn: t for t in state.tables}
    saved, now = meta["tables"], state.table_meta()
    if set(saved) != set(now) or any((saved[f]["rows"], saved[f]["dim"]) != (now[f]["rows"], now[f]["dim"])
                                     for f in now):  # fmt: skip
        raise CheckpointError(f"--resume-from {path}: its embedding tables differ from {s.name}'s "
                              "(another model); resume with the scenario that saved it")  # fmt: skip
    expert = s.parallelism.expert if state.ranks else 1
    same_mesh = meta["world"] == state.world and meta["mesh"] == (state.ranks.mesh.sizes() if state.ranks
                                                                  else {"world": 1})  # fmt: skip
    template = state._dense()
    regroup = _regroup_experts(template, state, meta["expert"], expert, path) if meta["expert"] != expert else None
    fast = {f for f in mine if same_mesh and saved[f] == now[f]}
    for f in fast:
        t = mine[f]
        if t.key:
            template[t.key] = t.weight.detach()
            template[f"{t.key}.sum"] = t.sum_get().clone()
    # the rest read whole on every rank (from the saved shards), then cut as this run lays them out;
    # TorchRec's tables always (its plan cuts them), in either backend's format
    rebuild = {f: _saved_keys(f, saved[f]) for f in now if f not in fast}
    for f, keys in rebuild.items():
        dtype = mine[f].weight.dtype if f in mine else torch.float32
        blocks = saved[f].get("blocks", 1) if saved[f].get("backend") == "torchrec" else None
        for key, shape in keys:
            template[key] = torch.empty(shape, dtype=dtype)
            template[f"{key}.sum"] = torch.empty((blocks, shape[0]) if blocks else shape[0], dtype=torch.float32)
    r = f"rank{state.rank}"
    own = same_mesh  # (the same world and mesh: this rank's own RNG states)
    if own:
        template[f"{r}.rng_cpu"] = torch.get_rng_state()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            template[f"{r}.rng_cuda"] = torch.cuda.get_rng_state()
    dcp.load(template, checkpoint_id=str(path), no_dist=state.world == 1)
    if regroup is not None:
        regroup()
    state._set_dense(template)
    with torch.no_grad():
        for f in fast:
            t = mine[f]
            if t.key:
                t.sum_set(template[f"{t.key}.sum"])
        to_trec: dict[int, tuple[object, dict, dict]] = {}
        for f, keys in rebuild.items():
            w, sums = _rebuild(saved[f], {k: template[k] for k, _ in keys}, {k: template[f"{k}.sum"] for k, _ in keys})
            if f in state.torchrec:  # sums per column block, as FBGEMM keeps them
                trec, n = state.torchrec[f]
                blocks = trec.blocks[n]
                sums = sums if sums.ndim == 2 else sums[None].expand(blocks, -1).clone()
                got = to_trec.setdefault(id(trec), (trec, {}, {}))
                got[1][n], got[2][n] = w.float(), sums
                continue
            # TorchRec's column blocks each sum the mean of g² over their own columns; the whole
            # row's mean is their mean (equal blocks): exact. (Native into TorchRec above: each
            # block starts from the row's sum, an approximation.)
            _cut_into(mine[f], w, sums.mean(0) if sums.ndim == 2 else sums, state)
        for trec, weights, sums in to_trec.values():
            trec.load_tables(weights)
            trec.load_accumulators(sums)
    if own:
        torch.set_rng_state(template[f"{r}.rng_cpu"])
        if f"{r}.rng_cuda" in template:
            torch.cuda.set_rng_state(template[f"{r}.rng_cuda"])
    return Loaded(path, int(meta["step"]), int(meta["data_position"]), same_mesh)


def _regroup_experts(template: dict, state: State, old: int, new: int, path: Path):
    """Ask ``template`` for the experts as a run of expert degree ``old`` saved them (each position's
    slice of every MoE layer's experts, DTensors over its ``expert_replicate`` read whole); returns
    the function that, after the load, puts this rank's slice (at degree ``new``) back under the
    keys this run has (a DTensor's own shard copied into it)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from torch.distributed.tensor import DTensor

    saved = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    fqns, pos = state._expert_fqns(), state.expert_pos
    suffix = f"@e{pos}" if new > 1 else ""
    olds = lambda base: [f"{base}@e{q}" for q in range(old)] if old > 1 else [base]  # noqa: E731
    moved: dict[str, tuple[object, list[str]]] = {}
    for k in [k for k in template if _names_param(k.removesuffix(suffix), fqns)]:
        base = k.removesuffix(suffix)
        keys = olds(base)
        missing = [q for q in keys if q not in saved]
        if missing:
            raise CheckpointError(f"--resume-from {path}: no {missing[0]} in it; its experts do not match "
                                  f"{state.scenario.name}'s model")  # fmt: skip
        mine = template.pop(k)
        for q in keys:
            m = saved[q]
            template[q] = (torch.empty(tuple(m.size), dtype=m.properties.dtype)
                           if isinstance(m, TensorStorageMetadata) else mine)  # fmt: skip
        moved[k] = (mine, keys)

    def put_back() -> None:
        for k, (mine, keys) in moved.items():
            parts = [template.pop(q) for q in keys]
            if not isinstance(parts[0], torch.Tensor) or parts[0].ndim == 0:  # a step count, a group's lr
                template[k] = parts[0]
                continue
            full = torch.cat(parts)
            n = full.shape[0] // new
            mine_slice = full[pos * n : (pos + 1) * n]
            if isinstance(mine, DTensor):
                mesh = mine.device_mesh
                local = torch.chunk(mine_slice, mesh.size(), dim=0)[mesh.get_local_rank()]
                mine.to_local().copy_(local)
                template[k] = mine
            else:
                template[k] = mine_slice.to(device=mine.device, dtype=mine.dtype) if isinstance(mine, Tensor) \
                    else mine_slice
    return put_back


def _saved_keys(fqn: str, m: dict) -> list[tuple[str, tuple[int, int]]]:
    """The DCP keys a saving run wrote for table ``fqn`` and their shapes."""
    if m["whole"]:
        return [(fqn, (m["rows"], m["dim"]))]
    L = _layout(m["layout"])
    out = []
    for r in range(m["R"]):
        for s in range(m["S"]):
            rows, c0, c1 = L.held(s, r)
            if L.place(s) is not None and len(rows):
                out.append((f"{fqn}@s{s}r{r}", (len(rows), c1 - c0)))
    return out


def _rebuild(m: dict, shards: dict[str, Tensor], sums: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """The whole table and its Adagrad sums from the shards a saving run wrote (under
    ``replicated_sync`` replica 0's: the replicas are averaged at their syncs; a column-split row's
    sums are the same in each of its column blocks)."""
    if m["whole"]:
        (w,), (s,) = shards.values(), sums.values()
        return w, s
    L = _layout(m["layout"])
    w = torch.zeros((m["rows"], m["dim"]), dtype=next(iter(shards.values())).dtype)
    acc = torch.zeros(m["rows"], dtype=torch.float32)
    for r in range(m["R"] if m["split"] else 1):
        for s in range(m["S"]):
            k = next((k for k in shards if k.endswith(f"@s{s}r{r}")), None)
            if k is None:
                continue
            rows, c0, c1 = L.held(s, r)
            w[rows, c0:c1] = shards[k]
            acc[rows] = sums[k]
    return w, acc


def _cut_into(t: _Table, whole: Tensor, sums: Tensor, state: State) -> None:
    """Copy this rank's part of a whole table (and sums) into its weight, in place (the weight is a
    view of a fused buffer the lookups read)."""
    if t.layout is None:
        t.weight.data.copy_(whole.to(t.weight.device))
        t.sum_set(sums)
        return
    pl = state.native.place
    rows, c0, c1 = t.layout.held(pl.shard, pl.replica)
    if t.weight.numel():
        t.weight.data.copy_(whole[rows, c0:c1].to(t.weight.device))
        t.sum_set(sums[rows])


__all__ = ["CheckpointError", "Checkpointer", "Found", "Loaded", "State", "commit",
           "find_latest", "load", "read_meta", "resolve_resume", "step_dir"]
