"""Lower bounds on a candidate's step without simulating it (torch-free); ``twin.planner``'s
docstring, step 1 "Bound", says how they are built and why they hold."""

from __future__ import annotations

from hwmodels.collectives import collective_cost
from hwmodels.groups import axis_layout
from hwmodels.network import get_network
from scenarios.schema import Scenario
from twin.imbalance import moe_load_factor
from twin.plan_space import Candidate, apply
from twin.flops import model_costs
from scenarios.placement import AR, axis_group
from scenarios.vocab import CommGroup
from twin.topology import topology_classes
from twin.workload import (COMPUTE, Hardware, Message, at_dense_shard, build_graph, host_issue_s, lookup_seconds,
                           messages, optimizer_s, table_sync_bytes, upload_seconds)

KEY_AXES = ("sparse_shard", "expert")  # collectives timed per key; the others count as zero
# The embedding lookups are priced per key, at its micro-batch and sparse_shard, as the graph prices
# them (``twin.workload.lookup_seconds``): re-timed by the load factor from the template's
# sparse_shard (2) they overshot their priced time (at 512 shards gem-b200-8k's template gave
# 4.254 x 5.21 ms = 22.2 ms a micro-batch against 17.3 ms priced, and the bound came out 0.95% above
# the simulated step), since a shard's distinct rows and the table placement move with sparse_shard.


class Bounds:
    """Lower bounds on the step, built from one micro-batch's op graph per compute choice."""

    def __init__(self, s: Scenario, gpus: int, gpu: str, network: str, expert_options: list[int],
                 shared: dict | None = None):  # fmt: skip
        self.s, self.gpus, self.gpu, self.network = s, gpus, gpu, network
        # the template turns every key collective on (a zero-time op where a key has group 1)
        self.t_expert = max(expert_options)
        self.t_ss = 2 if gpus % 2 == 0 else 1
        self.t_ds = 2 if gpus % 2 == 0 else 1  # FSDP's gathers in the template (zero in the key's bound)
        # Templates do not depend on the GPU count (per-rank compute; collectives re-timed or
        # zero), only on the GPU type and on which key collectives they hold: plans of one
        # scenario at several GPU counts (the forecast) share them through ``shared``.
        store = {} if shared is None else shared
        tk = (s.name, gpu, self.t_expert > 1, self.t_ss > 1, self.t_ds > 1)
        self.parts: dict[tuple, tuple[float, float, float]] = store.setdefault(("parts", tk), {})
        self.templates: dict[tuple, list[tuple]] = store.setdefault(("templates", tk), {})
        self.replica: dict[tuple, tuple[list, list]] = store.setdefault(("replica", tk), {})
        # lookups by (micro-batch, sparse_shard, per-GPU batch): the same in every depth copy of one scenario
        self.lookups: dict[tuple, dict] = store.setdefault(("lookups", gpu, gpus), {})
        self.moe: dict[tuple, float] = {}
        self.sync: dict[tuple, float] = {}  # replicated_sync's message by (sparse_shard, interval)
        self.host: dict[tuple, tuple] = {}  # host issue seconds (a micro-batch, a step) by (micro, ckpt, precision, per-GPU batch)
        self.opt: dict[tuple, float] = {}
        self.msgs: dict[tuple, tuple[int, list[Message]]] = {}  # _messages: (its dense_shard, messages) by key
        self.sums: dict[tuple, tuple] = {}  # _axis_sums by (messages' key, axis, its group and shape)
        self.timed: dict[tuple, list[tuple]] = {}  # _timed's collectives by (compute choice, axes timed)
        self.fastest: dict[tuple, float] = {}  # _fastest's, by its arguments
        self.programs: dict[tuple, list[tuple]] = store.setdefault(("programs", tk), {})  # _compile's, by (compute choice, live axes)
        self.net = get_network(network)

    def _flat(self, micro: int, ckpt: str, prec: str, expert=1, ss=1, per_gpu: int | None = None,
              ds: int = 1) -> Scenario:  # fmt: skip
        c = Candidate(micro, ckpt, prec, expert, ss, ds)
        return apply(self.s, c, gpus=self.gpus, gpu=self.gpu, network=self.network,
                     global_batch=(per_gpu or micro) * self.gpus)  # fmt: skip

    def _template(self, micro: int, ckpt: str, prec: str) -> list[tuple]:
        """One micro-batch's ops, compressed, as ``(what, (rest, lookups, experts), deps, kind,
        bytes, axis)``: ``what`` 's' is a run of compute ops (seconds of other compute; the
        embedding lookups it holds, as ``(op, forward?)`` pairs priced per key by
        ``_lookup_s``; seconds of expert matmuls at load factor 1), 'k' a key collective, 'z' any
        other collective (zero). A run ends where a collective depends on its last op and a new
        one starts at a compute op that waits for a collective, so inside a run each op starts when
        the previous one ends; ``deps`` index earlier entries."""
        k = (micro, ckpt, prec)
        if k in self.templates:
            return self.templates[k]
        flat = self._flat(micro, ckpt, prec, expert=self.t_expert, ss=self.t_ss, ds=self.t_ds)
        mf = moe_load_factor(flat)
        ops = [op for op in build_graph(flat, Hardware.of(flat)).ops if op.op_class != "optimizer"]
        waited_on = {d for op in ops if op.stream != COMPUTE for d in op.deps}
        rows: list[list] = []
        where: dict[str, int] = {}  # op name -> its entry
        run = None  # the open run of compute ops
        for op in ops:
            deps = {where[d] for d in op.deps}
            if op.stream != COMPUTE:
                run = None
                what = "k" if op.axis in KEY_AXES else "z"
                rows.append([what, (0.0, 0.0, 0.0), tuple(sorted(deps)), op.op_class, op.bytes,
                             op.axis, op.phase == "data"])  # fmt: skip
            else:
                if run is None or any(rows[d][0] != "s" for d in deps):
                    rows.append(["s", [0.0, (), 0.0], tuple(sorted(d for d in deps
                                 if rows[d][0] != "s")), "", 0.0, "", False])  # fmt: skip
                    run = rows[-1]
                if op.op_class == "embedding":
                    run[1][1] += ((op.name.rsplit(".", 1)[0], op.phase != "bwd"),)
                elif ".experts_up." in op.name or ".experts_down." in op.name:
                    run[1][2] += op.duration_s / mf
                else:
                    run[1][0] += op.duration_s
            where[op.name] = len(rows) - 1
            if op.stream == COMPUTE and op.name in waited_on:
                run = None  # a collective waits for this op: the run ends here
        self.templates[k] = [(w, tuple(d), deps, kind, nb, ax, data) for w, d, deps, kind, nb, ax, data in rows]
        runs = [i for i, r in enumerate(rows) if r[0] == "s"]
        first, last = runs[0], runs[-1]
        head = [(r[3], r[4]) for i, r in enumerate(rows) if r[5] == "sparse_replica"
                and not r[2] and i in rows[first][2]]  # fmt: skip
        tail = [(r[3], r[4]) for i, r in enumerate(rows) if r[5] == "sparse_replica"
                and last in r[2] and i > last]  # fmt: skip
        self.replica[k] = (head, tail)
        return self.templates[k]

    def _split(self, micro: int, ckpt: str, prec: str) -> tuple[float, tuple, float]:
        """One micro-batch's compute: (seconds of the rest, its embedding lookups, seconds of
        expert matmuls)."""
        k = (micro, ckpt, prec)
        if k not in self.parts:
            runs = [d for what, d, *_ in self._template(micro, ckpt, prec) if what == "s"]
            self.parts[k] = (sum(r[0] for r in runs), sum((r[1] for r in runs), ()), sum(r[2] for r in runs))
        return self.parts[k]

    def _lookup_s(self, c: Candidate, lookups: tuple, per_gpu: int) -> float:
        """Seconds of these lookups, ``(op, forward?)`` pairs, at ``c``'s micro-batch, sparse_shard
        and micro-batches a step, as the simulation prices them (the load factor included; how the
        sparse update runs, fused into the backward or not, depends on the micro-batches a step:
        ``scenarios.execution``)."""
        if not lookups:
            return 0.0
        k = (c.micro_batch, c.sparse_shard, per_gpu)
        if k not in self.lookups:
            flat = self._flat(c.micro_batch, c.activation_checkpointing, c.precision, ss=c.sparse_shard,
                              per_gpu=per_gpu)  # fmt: skip
            self.lookups[k] = lookup_seconds(flat, Hardware.of(flat))
        priced = self.lookups[k]
        return sum(priced[name][0 if fwd else 1] for name, fwd in lookups)

    def _moe_factor(self, c: Candidate) -> float:
        mk = (c.micro_batch, c.expert)
        if mk not in self.moe:
            flat = self._flat(c.micro_batch, c.activation_checkpointing, c.precision, expert=c.expert)
            self.moe[mk] = moe_load_factor(flat)
        return self.moe[mk]

    def compute_bound_s(self, c: Candidate, per_gpu: int, *, lookups: bool = True) -> float:
        """Sum of the rank's compute ops but the optimizer: at most the compute stream's busy time.
        ``lookups=False``: without the lookups (looser, and cheaper)."""
        rest, ops, exp = self._split(c.micro_batch, c.activation_checkpointing, c.precision)
        lk = self._lookup_s(c, ops, per_gpu) if lookups else 0.0
        return per_gpu // c.micro_batch * (rest + lk + self._moe_factor(c) * exp)

    def bound_s(self, c: Candidate, per_gpu: int, *, lookups: bool = True) -> float:
        """The communication-aware bound (module docstring): never below ``compute_bound_s``.
        ``lookups=False``: the lookups at zero, a looser bound that needs no pricing of them."""
        chain, stream_sum = self._walk(c, per_gpu, lookups=lookups)
        return per_gpu // c.micro_batch * max(chain, *stream_sum.values())

    def _walk(self, c: Candidate, per_gpu: int, *, lookups: bool = True, head: float = 0.0,
              groups: dict | None = None, timer=None):  # fmt: skip
        """One micro-batch's template with the key's collectives timed, as (the end of its last
        compute op, each key collective stream's serial sum). Each collective stream runs one op
        at a time, in program order (the next batch's ids aside: they wait for nothing and nothing
        waits for them, so over several micro-batches they run whenever their stream is free).
        ``head``: when the first lookups can start at the earliest; ``groups``: the variant's (size, stride) of each key axis and of ``dense_shard``, so that
        FSDP's gathers and reduce-scatters are timed too (their messages do not depend on it;
        else they count as zero and a key axis has stride 1, the fastest a key allows);
        ``timer(kind, bytes, axis, size, stride, imbalance)``: a collective's seconds (else the
        fastest group's, ``_fastest``)."""
        price = self._lookup_s if lookups else (lambda c, ops, per_gpu: 0.0)
        mf = self._moe_factor(c)
        sm_free = self.s.parallelism.sm_free_collectives
        if groups is None:
            groups = {"sparse_shard": (c.sparse_shard, 1), "expert": (c.expert, 1)}
        if timer is None:
            def timer(kind, nbytes, axis, size, stride, imbalance):
                return self._fastest(kind=kind, msg_bytes=nbytes, group_size=size, stride=stride, sm_free=sm_free,
                                     imbalance=imbalance)  # fmt: skip
        live = frozenset(a for a, (size, _) in groups.items() if size > 1 and (a in KEY_AXES or a == "dense_shard"))
        pk = (c.micro_batch, c.activation_checkpointing, c.precision, live)
        if pk not in self.programs:
            self.programs[pk] = _compile(self._template(c.micro_batch, c.activation_checkpointing, c.precision), live)
        times: dict[tuple, float] = {}
        finish: list[float] = []
        chain = 0.0  # end of the last compute op (program order on the compute stream)
        stream_sum = dict.fromkeys(KEY_AXES, 0.0)
        for compute, deps, body in self.programs[pk]:
            start = 0.0
            for i in deps:  # (a loop: this walk runs for every candidate a plan bounds)
                if finish[i] > start:
                    start = finish[i]
            if compute:
                if chain > start:
                    start = chain
                for rest, ops, exp in body:  # runs one after the other on the compute stream
                    if ops:
                        if head:
                            start, head = max(start, head), 0.0
                        chain = start + rest + price(c, ops, per_gpu) + mf * exp
                    else:
                        chain = start + rest + mf * exp
                    start = chain
                finish.append(chain)
                continue
            tk, key, data = body
            d = 0.0
            if tk[1] > 0:
                if tk not in times:
                    times[tk] = timer(*tk, *groups[tk[2]], mf if tk[2] == "expert" else 1.0)
                d = times[tk]
                if key:
                    stream_sum[tk[2]] += d
            # the next batch's ids: nothing waits for them, and over several micro-batches they run
            # whenever their stream is free, so they hold no one up
            finish.append(start if data else start + d)
        return chain, stream_sum

    def variant_extra_s(self, c: Candidate) -> float:
        """What a variant adds to the key's bound: its dense optimizer step, which waits for the
        rest of the step (the template leaves the optimizer out: its time moves with
        ``dense_shard``); and for a fully sharded layout, the first micro-batch's lookups wait for
        its replica all-gather (nothing runs before it) and the step's end waits for the replica
        reduce-scatter after the last backward op (nothing runs after it); nothing more for
        ``replicated_sync`` (``floor_s`` bounds its all-reduce) or one replica."""
        opt = self._optimizer_s(c)
        replicas = self.gpus // c.sparse_shard
        if c.sparse_strategy != "fully_sharded" or replicas <= 1:
            return opt
        self._template(c.micro_batch, c.activation_checkpointing, c.precision)
        head, tail = self.replica[(c.micro_batch, c.activation_checkpointing, c.precision)]
        sm_free = self.s.parallelism.sm_free_collectives

        def t(ops):
            return max([self._fastest(kind=kind, msg_bytes=nb, group_size=replicas, stride=c.sparse_shard,
                                      sm_free=sm_free) for kind, nb in ops if nb > 0], default=0.0)  # fmt: skip

        return opt + t(head) + t(tail)

    def floor_s(self, c: Candidate, per_gpu: int) -> float:
        """A bound of the variant's own, beside ``bound_s + variant_extra_s``: the step's compute
        (``compute_bound_s``), then ``replicated_sync``'s all-reduce of the table shard, then the
        dense optimizer step. The compute stream runs its ops one at a time in program order; the
        embeddings' backward is its last op before the optimizer (the backward runs in reverse
        layer order and the lookups are the first layer), the sync waits for it and the optimizer
        for the sync (``twin.workload``). And at least the host's time to issue the micro-batches'
        forward and backward calls (``twin.workload.host_issue_s``; 0 under CUDA graphs), the
        step's floor when the host is slower than the devices."""
        devices = self.compute_bound_s(c, per_gpu) + self._optimizer_s(c) + self._sync_s(c)
        hk = (c.micro_batch, c.activation_checkpointing, c.precision, per_gpu)
        if hk not in self.host:
            flat = self._flat(c.micro_batch, c.activation_checkpointing, c.precision, per_gpu=per_gpu)
            self.host[hk] = host_issue_s(flat, Hardware.of(flat))
        per_mb, once = self.host[hk]
        # the host's time is the graph's own sum in another order: 1e-12 under it absorbs the rounding
        return max(devices, (per_gpu // c.micro_batch * per_mb + once) * (1 - 1e-12))

    def stream_floor_s(self, c: Candidate, per_gpu: int) -> float:
        """A bound from the candidate's own collectives (``twin.workload.messages``, ~1 ms a
        topology class, so the planner asks for it only before building a lower bound's graphs),
        for each topology class of its ranks (``twin.topology``: each class's groups priced on
        their own shape, as its graph prices them; the step waits for the slowest): each stream
        runs its ops one at a time, and the optimizer waits for every stream's last op but the
        next batch's inputs, so the step is at least the busiest stream's sum, plus the
        optimizer; and the compute of all micro-batches but the last (the first's lookups behind
        its replica rows' all-gather, which waits for nothing, its copy to the GPU beside it),
        then the last one's chain (``_walk``, FSDP's collectives included), then the embeddings'
        gradient reductions (each stream's once-a-step sum: they wait for the embeddings'
        backward, the compute stream's last op), then the optimizer."""
        sc = apply(self.s, c, gpus=self.gpus, gpu=self.gpu, network=self.network, global_batch=per_gpu * self.gpus)
        hw = Hardware.of(sc)
        accum = per_gpu // c.micro_batch
        (mk, moving), by_axis = self._messages(c, per_gpu, sc, hw)
        groups = {str(a): axis_group(sc, a) for a in (CommGroup.EXPERT, CommGroup.SPARSE_SHARD, CommGroup.DENSE_SHARD)}
        opt = self._optimizer_s(c)
        compute = self.compute_bound_s(c, per_gpu)
        up = None
        sm_free = self.s.parallelism.sm_free_collectives
        mf = self._moe_factor(c)
        topo, _ = topology_classes(sc, self.net)
        of_axis = {a: axis_group(sc, a) for a in by_axis}
        walked = groups if self.t_ds > 1 else {k: v for k, v in groups.items() if k != "dense_shard"}
        timed = self._timed(c, walked)
        classes = []  # (streams, the chain's reductions after it and replica gather before it, its collectives' s, timer)
        for cls in topo:
            seen: dict = {}

            def timer(kind, nbytes, axis, size, stride, imbalance, shapes=cls.shapes, seen=seen):
                k = (kind, nbytes, axis, size, stride, imbalance)
                if k not in seen:
                    seen[k] = collective_cost(kind=kind, msg_bytes=nbytes, group_size=size, stride=stride,
                                              network=self.net, sm_free=sm_free, imbalance=imbalance,
                                              shape=shapes.get(axis)).time_s  # fmt: skip
                return seen[k]
            streams, tail, head = 0.0, 0.0, 0.0
            for axis, ms in by_axis.items():
                size, stride = of_axis[axis]
                # the gradient shards' all-reduce (on dense_replicate) is the one message that moves with dense_shard
                sk = (mk, axis, size, stride, cls.shapes.get(axis), c.dense_shard if axis in moving else 0)
                if sk not in self.sums:
                    self.sums[sk] = _axis_sums(ms, timer, size, stride, mf if axis == CommGroup.EXPERT else 1.0, accum)
                total, t_tail, h, waited = self.sums[sk]
                streams = max(streams, total + (opt if waited else 0.0))
                tail, head = max(tail, t_tail), head + h
            classes.append((streams, (tail, head, *(timer(*t) for t in timed)), timer))
        best = 0.0
        for i, (streams, lengths, timer) in enumerate(classes):
            best = max(best, streams)
            if any(_beats(j, i, [x[1] for x in classes]) for j in range(len(classes))):
                continue  # its chain is no longer than one walked (module docstring of _beats)
            tail, head = lengths[0], lengths[1]
            chain, _ = self._walk(c, per_gpu, head=head if accum == 1 else 0.0, groups=walked, timer=timer)
            if accum > 1:
                if head and up is None:
                    up = upload_seconds(sc, hw)
                chain += max(up or 0.0, head) - (up or 0.0) + (accum - 1) * compute / accum
            best = max(best, chain + tail + opt)
        return best * (1 - 1e-12)  # sums in another order than the graph's: rounding

    def _timed(self, c: Candidate, groups: dict) -> list[tuple]:
        """The ``timer`` arguments of the collectives ``_walk`` times on ``groups`` and its chain
        waits for (the next batch's ids aside: nothing waits for them), each once."""
        live = tuple(sorted(a for a, (size, _) in groups.items() if size > 1))
        k = (c.micro_batch, c.activation_checkpointing, c.precision, live)
        if k not in self.timed:
            self.timed[k] = list(dict.fromkeys(
                (kind, nbytes, axis) for what, _, _, kind, nbytes, axis, data in self._template(
                    c.micro_batch, c.activation_checkpointing, c.precision)
                if (what == "k" or axis == "dense_shard") and axis in live and nbytes > 0 and not data))  # fmt: skip
        mf = self._moe_factor(c)
        return [(kind, nbytes, axis, *groups[axis], mf if axis == "expert" else 1.0)
                for kind, nbytes, axis in self.timed[k]]  # fmt: skip

    def _messages(self, c: Candidate, per_gpu: int, sc: Scenario, hw: Hardware) -> tuple[tuple, dict]:
        """The candidate's collectives (``twin.workload.messages``) by axis, in program order, with
        the key they were listed under and the axes whose messages move with ``dense_shard``: once
        per key, strategy and per-GPU batch (and which dense axes have groups of more than one
        rank), re-sized for each ``dense_shard`` (``twin.workload.at_dense_shard``: the gradient
        shards' all-reduce)."""
        k = (c.micro_batch, c.activation_checkpointing, c.precision, c.expert, c.sparse_shard, c.sparse_strategy,
             c.sparse_sync_interval, per_gpu, c.dense_shard > 1, self.gpus // c.dense_shard > 1)  # fmt: skip
        if k not in self.msgs:
            by_axis: dict = {}
            for m in messages(sc, hw):
                by_axis.setdefault(m.axis, []).append(m)
            self.msgs[k] = (c.dense_shard, by_axis, {a for a, ms in by_axis.items() if any(m.dense_params for m in ms)})
        ds, by_axis, moving = self.msgs[k]
        if ds != c.dense_shard:
            by_axis = {a: at_dense_shard(ms, sc) if a in moving else ms for a, ms in by_axis.items()}
        return (k, moving), by_axis

    def _sync_s(self, c: Candidate) -> float:
        """``replicated_sync``'s all-reduce of the table shard, on the fastest replica group (0 for
        ``fully_sharded`` or one replica)."""
        replicas = self.gpus // c.sparse_shard
        if c.sparse_strategy != "replicated_sync" or replicas <= 1:
            return 0.0
        k = (c.sparse_shard, c.sparse_sync_interval)
        if k not in self.sync:
            sc = apply(self.s, c, gpus=self.gpus, gpu=self.gpu, network=self.network,
                       global_batch=c.micro_batch * self.gpus)  # fmt: skip
            self.sync[k] = table_sync_bytes(sc, model_costs(sc.model, batch=c.micro_batch, precision=sc.precision))
        if self.sync[k] <= 0:
            return 0.0
        return self._fastest(kind=AR, msg_bytes=self.sync[k], group_size=replicas, stride=c.sparse_shard,
                             sm_free=self.s.parallelism.sm_free_collectives)  # fmt: skip

    def _optimizer_s(self, c: Candidate) -> float:
        """The dense optimizer step of the candidate's shards: it waits for every other op of the
        step (``twin.workload._optimizer``), so it adds to any bound on what comes before it."""
        k = (c.micro_batch, c.precision, c.dense_shard, c.expert)
        if k not in self.opt:
            sc = apply(self.s, Candidate(c.micro_batch, c.activation_checkpointing, c.precision, c.expert,
                                         c.sparse_shard, c.dense_shard), gpus=self.gpus, gpu=self.gpu,
                       network=self.network, global_batch=c.micro_batch * self.gpus)  # fmt: skip
            costs = model_costs(sc.model, batch=c.micro_batch, precision=sc.precision)
            self.opt[k] = optimizer_s(sc, Hardware.of(sc), costs)
        return self.opt[k]

    def _fastest(self, *, group_size: int, stride: int, **kw) -> float:
        """The collective over the axis's groups as the simulation prices them (their layout on
        the job's GPUs, hwmodels.groups.axis_layout), the fastest group's: a lower bound. Once
        per collective and group (``self.fastest``)."""
        k = (group_size, stride, *sorted(kw.items()))
        if k not in self.fastest:
            if self.gpus % (group_size * stride):
                t = collective_cost(group_size=group_size, stride=stride, network=self.net, **kw).time_s
            else:
                layout = axis_layout(self.net, size=group_size, stride=stride, num_gpus=self.gpus)
                t = min(collective_cost(group_size=group_size, stride=stride, network=self.net, shape=sh, **kw).time_s
                        for sh in layout.shapes)  # fmt: skip
            self.fastest[k] = t
        return self.fastest[k]


def _compile(template: list[tuple], live: frozenset) -> list[tuple]:
    """``template`` (``Bounds._template``) as ``Bounds._walk`` runs it when only the collectives
    on ``live`` axes take time: ``(compute?, deps, body)`` entries, ``body`` a run's segments
    ``(rest, lookups, experts)`` or a collective's ``((kind, bytes, axis), key?, data?)``. The
    same numbers, with less to walk (a walk runs for every candidate a plan bounds):

    - a collective on another axis takes no time, so it ends when the last of its deps and of its
      stream predecessor ends (the next batch's ids: of its deps): it is dropped and whatever
      waits for it waits for those instead; a kept collective lists its stream predecessor among
      its deps (so the walk needs no stream state);
    - of the entries a dep set holds, only the last compute run and each collective stream's last
      op (the next batch's ids aside) can end last: a run ends no earlier than the ones before it,
      and a stream's op no earlier than its predecessor, so the rest are dropped (max is exact);
      a run lists no run among its deps (it starts after the previous one anyway);
    - a run with no deps left that follows a run nobody else waits for is merged into it, as a
      further segment: it starts when that one ends, as the template's walk has it.
    """
    out: list[list] = []  # [compute?, deps, body, stream axis or None, data?]
    res: list[frozenset] = []  # each template entry: the program entries whose latest end is its end
    last_on: dict[str, int] = {}  # each stream's last template entry (the next batch's ids aside)

    def reduced(deps) -> tuple:
        last_run, by_stream, keep = -1, {}, set()
        for i in deps:
            if out[i][0]:
                last_run = max(last_run, i)
            elif out[i][4]:
                keep.add(i)
            else:
                by_stream[out[i][3]] = max(by_stream.get(out[i][3], -1), i)
        return tuple(sorted(keep | set(by_stream.values()) | ({last_run} if last_run >= 0 else set())))

    for j, (what, (rest, ops, exp), deps, kind, nbytes, axis, data) in enumerate(template):
        waits = set().union(*(res[d] for d in deps)) if deps else set()
        if what == "s":
            out.append([True, tuple(i for i in reduced(waits) if not out[i][0]), [(rest, ops, exp)], None, False])
            res.append(frozenset({len(out) - 1}))
            continue
        if not data and axis in last_on:
            waits |= res[last_on[axis]]
        if not data:
            last_on[axis] = j
        if axis in live:
            out.append([False, reduced(waits), ((kind, nbytes, axis), what == "k", data), axis, data])
            res.append(frozenset({len(out) - 1}))
        else:
            res.append(frozenset(reduced(waits)))
    # merge runs: a run without deps into the run right before it, when nothing else waits for that one
    waited = {i for e in out for i in e[1]}
    merged: list[list] = []
    where: dict[int, int] = {}
    for i, e in enumerate(out):
        if e[0] and not e[1] and merged and merged[-1][0] and (i - 1) not in waited and where.get(i - 1) == len(merged) - 1:
            merged[-1][2].append(e[2][0])
        else:
            merged.append([e[0], e[1], e[2], e[3], e[4]])
        where[i] = len(merged) - 1
    return [(e[0], tuple(sorted({where[d] for d in e[1]})), tuple(e[2]) if e[0] else e[2]) for e in merged]


def _beats(j: int, i: int, lengths: list[tuple]) -> bool:
    """Whether topology class ``j``'s chain in ``stream_floor_s`` is at least class ``i``'s, so
    that ``i`` need not be walked: ``j``'s embedding reductions after the chain, its replica
    gather before it and each collective the chain times (``_timed``) all take at least ``i``'s
    (the walk only adds and takes maxima, which round monotonically, so the chain cannot come out
    shorter), and ``j`` takes longer in one of them or comes first. Acyclic: a class that is not
    walked is covered by one that is."""
    if j == i or not all(a >= b for a, b in zip(lengths[j], lengths[i])):
        return False
    return j < i or any(a > b for a, b in zip(lengths[j], lengths[i]))


def _axis_sums(msgs: list[Message], timer, size: int, stride: int, imbalance: float,
               accum: int) -> tuple[float, float, float, bool]:  # fmt: skip
    """One axis's stream in a step (``Bounds.stream_floor_s``): its serial sum (every micro-batch's
    messages ``accum`` times), its embeddings' once-a-step reductions (after the last backward), its
    replica rows' all-gathers before the lookups (``sparse_replica``'s), and whether the optimizer
    waits for it (a message other than the next batch's inputs). Summed in program order."""
    total = tail = head = 0.0
    waited = False
    seen: dict = {}
    for m in msgs:
        t = seen.get((m.kind, m.msg_bytes))
        if t is None:
            t = seen[(m.kind, m.msg_bytes)] = timer(m.kind, m.msg_bytes, m.axis, size, stride, imbalance)
        total += t * (accum if m.every_micro_batch else 1)
        waited = waited or not m.data
        if m.layer == "emb" and not m.every_micro_batch:
            tail += t
        if m.layer == "emb" and m.axis == CommGroup.SPARSE_REPLICA and m.every_micro_batch and not m.data:
            head += t  # the replica rows' all-gather, before the lookups
    return total, tail, head, waited


# ---- search ----------------------------------------------------------------------------------


class FoldedBounds:
    """``Bounds`` of a deep GEM model from its shallow copies' (``twin.fold``): every bound is a
    sum of per-layer times plus the rest, so it lies on the line through them."""

    def __init__(self, copies: list[Bounds], fold):
        self.copies, self.fold = copies, fold

    def _combine(self, method: str, *args, **kw) -> float:
        return self.fold.combine([getattr(b, method)(*args, **kw) for b in self.copies])

    def compute_bound_s(self, c: Candidate, per_gpu: int, *, lookups: bool = True) -> float:
        return self._combine("compute_bound_s", c, per_gpu, lookups=lookups)

    def bound_s(self, c: Candidate, per_gpu: int, *, lookups: bool = True) -> float:
        return self._combine("bound_s", c, per_gpu, lookups=lookups)

    def variant_extra_s(self, c: Candidate) -> float:
        return self._combine("variant_extra_s", c)

    def floor_s(self, c: Candidate, per_gpu: int) -> float:
        return self._combine("floor_s", c, per_gpu)

    def stream_floor_s(self, c: Candidate, per_gpu: int) -> float:
        return self._combine("stream_floor_s", c, per_gpu)
