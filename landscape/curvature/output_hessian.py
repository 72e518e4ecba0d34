"""Moved: the closed-form output Hessians live in :mod:`landscape.curvature.ggn` beside the GGN that
uses them; ``landscape.curvature.output_hessian.output_hessian`` / ``closed_form_kind`` still work,
with a ``DeprecationWarning``, for one release."""

from landscape.deprecation import moved_names

__getattr__ = moved_names(
    __name__, dict.fromkeys(("output_hessian", "closed_form_kind"), "landscape.curvature.ggn")
)
