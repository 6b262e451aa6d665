"""The twin: workload builder, simpy engine, results, planner and forecaster (torch-free).

Scripts and notebooks use ``twin.api`` (``from twin.api import load, simulate, sweep, ...``):
its ``__all__`` is the public surface. The functions are not re-exported here because
``twin.simulate``, ``twin.sweep``, ``twin.forecast`` and ``twin.validate`` are modules, and
importing a module rebinds its name on this package.
"""
