"""Implementation of the sharpness measures behind :func:`landscape.sharpness` (one module per family).

Every measure is a function ``measure(ctx, **options) -> dict`` taking a :class:`_common.Ctx` (the
objective, the flat parameter vector ``w0`` and the evaluation counters) and returning
``dict(value=..., stderr=..., config=..., extra=...)``; ``landscape.sharpness`` wraps it in a
:class:`landscape.sharpness.SharpnessResult` with the evaluation counts and the run time.
"""
