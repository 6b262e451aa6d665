"""The collectives' route: gloo on the CPU, NCCL on CUDA, and NCCL's SM-free path when the
Scenario asks for it (``parallelism.sm_free_collectives``).

SM-free collectives (NCCL >= 2.28) run all-gather and all-to-all on the copy engines inside an
NVLink domain, so that they take no SM from the compute they overlap (the twin prices them so:
``hwmodels.collectives``, ``SM_FREE_KINDS``). The route: the NCCL process group is created with
the zero-CTA policy (``ProcessGroupNCCL.Options().config.cta_policy``), symmetric memory is set
to NCCL's backend, and FSDP2 units take their all-gather buffers from it where torch has
``set_symm_mem_for_comm`` (2.13+). Where any piece is missing, the run stops with one line that
names it: it never falls back to SM kernels behind the Scenario's back (``SmFreeUnavailable``).

Not verified here: NCCL reports a silent fall-back to 2-CTA kernels only in its
``NCCL_DEBUG=INFO`` log ("Copy Engine"), which a run on several GPUs must read (ENV.md).
"""

from __future__ import annotations

import torch

from scenarios.schema import Scenario

MIN_NCCL = (2, 28)
FIX = "set parallelism.sm_free_collectives=false"


class SmFreeUnavailable(ValueError):
    """The Scenario asks for SM-free collectives and this runtime cannot give them (one line)."""


def collective_path(scenario: Scenario, backend: str) -> str:
    """What the RunRecord's ``collective_path`` says: ``gloo``, ``nccl`` or ``nccl-zero-cta``."""
    if backend == "nccl" and scenario.parallelism.sm_free_collectives:
        return "nccl-zero-cta"
    return backend


def process_group_options(scenario: Scenario, backend: str):
    """``pg_options`` for ``init_process_group``: None, or NCCL's options with the zero-CTA policy.
    Raises ``SmFreeUnavailable`` where the Scenario asks for SM-free collectives and the runtime
    lacks a piece of the route."""
    if not scenario.parallelism.sm_free_collectives:
        return None
    if backend != "nccl":
        raise SmFreeUnavailable(f"parallelism.sm_free_collectives is true, but this run's collectives are {backend}'s "
                                f"(no copy-engine path off NCCL): {FIX}, or run on CUDA GPUs")  # fmt: skip
    return zero_cta_options()


def zero_cta_options(fix: str = FIX):
    """NCCL's process-group options with the zero-CTA policy; ``SmFreeUnavailable`` (naming ``fix``)
    where this torch's NCCL is too old or torch cannot set the policy."""
    import torch.distributed as dist

    version = _nccl_version()
    if version < MIN_NCCL:
        raise SmFreeUnavailable(f"parallelism.sm_free_collectives needs NCCL >= {'.'.join(map(str, MIN_NCCL))}, and "
                                f"this torch has NCCL {'.'.join(map(str, version)) or 'none'}: {fix}, or "
                                "install a torch built with a newer NCCL")  # fmt: skip
    pg = getattr(dist, "ProcessGroupNCCL", None)
    options = pg.Options() if pg is not None else None
    config = getattr(options, "config", None)
    policy = _zero_cta_policy(pg)
    if config is None or not hasattr(config, "cta_policy") or policy is None:
        raise SmFreeUnavailable(f"parallelism.sm_free_collectives: torch {torch.__version__} has no NCCL CTA policy "
                                f"(ProcessGroupNCCL.Options().config.cta_policy): {fix}, or use torch >= 2.11")  # fmt: skip
    config.cta_policy = policy
    return options


def enable_symmetric_memory(scenario: Scenario, backend: str) -> None:
    """Symmetric memory on NCCL's backend for the SM-free route (after the group is up)."""
    if backend != "nccl" or not scenario.parallelism.sm_free_collectives:
        return
    try:
        from torch.distributed import _symmetric_memory as symm_mem
    except ImportError as e:
        raise SmFreeUnavailable(f"parallelism.sm_free_collectives: this torch has no symmetric memory ({e}): {FIX}") from e
    symm_mem.set_backend("NCCL")


def fsdp_symmetric_buffers(module, scenario: Scenario, backend: str) -> None:
    """An FSDP2 unit's all-gathers into symmetric-memory buffers (the copy-engine path needs them),
    where torch has ``set_symm_mem_for_comm``; without it the unit's gathers run zero-CTA only if
    NCCL registers their buffers itself, which the run's NCCL log tells (ENV.md)."""
    if backend == "nccl" and scenario.parallelism.sm_free_collectives and hasattr(module, "set_symm_mem_for_comm"):
        module.set_symm_mem_for_comm("NCCL")


def _nccl_version() -> tuple[int, ...]:
    try:
        v = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 - no NCCL in this build
        return ()
    return tuple(v) if isinstance(v, tuple) else (v // 10000, v // 100 % 100, v % 100)


def _zero_cta_policy(pg):
    """NCCL's zero-CTA policy constant, where torch exposes it (the class or the C module)."""
    for owner in (pg, getattr(torch._C, "_distributed_c10d", None)):
        for name in ("NCCL_CTA_POLICY_ZERO", "CTA_POLICY_ZERO"):
            if owner is not None and hasattr(owner, name):
                return getattr(owner, name)
    return None
