"""Scheduler backends: ``plan(ctx) -> JobPlan`` (pure) and ``submit(plan, ...)``.

Backends are imported lazily through :data:`jobgen.plan.BACKENDS`.
"""
