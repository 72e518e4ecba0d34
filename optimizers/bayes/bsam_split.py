"""bSAM's flat state, the pieces of its step and the split-step API.

:class:`FlatState` keeps the precision ``s`` and the momentum ``g_m`` of :class:`optimizers.BayesianSAM`
in one flat buffer each per param group, dtype and device; ``state[p]["s"]`` / ``["exp_avg"]`` are
views into them, so ``state_dict()`` stays per parameter as in ``torch.optim``.  An elementwise
update is then one kernel per buffer instead of one per parameter tensor (``torch._foreach_*`` runs
a loop of kernels on a CPU), which is what a launch-bound step costs; the weights are saved, set
and restored with one ``_foreach_copy_`` each.  The arithmetic is the per-tensor one, element by
element, in the same order (``tests/test_bsam_flat_state.py``); only the diagnostics' norms are
summed in another order.  The price is memory: besides ``s`` and ``g_m``, three scratch buffers
(the saved weights, the perturbed weights, a pass's gradients) and ``1/sqrt(N s)``, ``sqrt(s)``
(computed once per value of ``s``) are kept between steps, five parameter-sized buffers more.

The split-step interface of the SAM family (:mod:`optimizers.perturbation`) for
:class:`optimizers.BayesianSAM`, whose first gradient is taken at the noisy point ``w + e``
(Moellenhoff & Khan 2023, Alg. 1, line 3)::

    opt.noise_step()                          # w <- w + e, e ~ N(0, 1 / (N s)) (noise=True only)
    loss_fn(model(x), y).backward()           # g at w + e
    opt.first_step(zero_grad=True)            # w <- w + rho g / s
    loss_fn(model(x), y).backward()           # g_eps
    opt.second_step(zero_grad=True)           # w restored; momentum, s and w updated

The update equals ``step(closure)``'s (m = 1) bit for bit: the same helpers run the same
operations in the same order (``tests/test_split_step.py``). The passes' losses are the caller's,
so ``last["loss"]`` and ``last["loss_perturbed"]`` are NaN after a split step. The calls follow
the protocol of :mod:`optimizers.step_protocol` (states ``idle`` -> ``noise`` -> ``open``; a call out
of turn is refused and changes nothing, the generator included; ``cancel_step()`` undoes
``noise_step()`` or ``first_step()``); a NaN / inf gradient raises
:class:`~optimizers.step_protocol.NonFiniteGradient` with the weights left at ``w``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from optimizers.bn_state import bn_restore, bn_snapshot
from optimizers.step_protocol import (
    IDLE,
    NOISE,
    OPEN,
    SplitProtocol,
    StepOrderError,
    check_finite,
    grad_marks,
)

__all__ = ["BSAMSplitStep", "FlatState", "sum_sq"]


def sum_sq(tensors: list[torch.Tensor]) -> torch.Tensor:
    """``sum_i ||t_i||^2`` as a 0-d tensor (one ``foreach`` norm, no host read)."""
    return torch.stack(torch._foreach_norm(tensors)).square().sum()


def _norm(parts: list[torch.Tensor]) -> torch.Tensor:
    """The norm of a vector from the norms of its parts (the part's own norm for one part)."""
    return parts[0] if len(parts) == 1 else torch.stack(parts).square().sum().sqrt()


class _Bucket:
    """The parameters of one param group with one dtype and device, and their flat buffers."""

    def __init__(self, group: dict[str, Any], pos: list[int], params: list[torch.Tensor]) -> None:
        self.group, self.pos, self.params = group, pos, params
        self.numels = [p.numel() for p in params]
        self.shapes = [p.shape for p in params]
        n, p0 = sum(self.numels), params[0]
        self.s, self.exp_avg, self.saved, self.point, self.grad = (
            torch.empty(n, dtype=p0.dtype, device=p0.device) for _ in range(5)
        )
        self.grad_views = self.views(self.grad)
        self._derived: dict[str, tuple[int, torch.Tensor]] = {}

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        return [t.view(shape) for t, shape in zip(flat.split(self.numels), self.shapes)]

    def derived(self, key: str, fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """``fn(s)``, computed once per value of ``s`` (its version counter, which every in-place
        change of ``s`` or of a view of it advances); read-only for the caller."""
        hit = self._derived.get(key)
        if hit is None or hit[0] != self.s._version:
            hit = self._derived[key] = (self.s._version, fn(self.s))
        return hit[1]


class FlatState:
    """bSAM's state of the parameters ``pairs`` (``(group, p)``) in flat buffers (see the module).

    Per bucket: ``s`` and ``exp_avg`` (the state; ``state[p]`` holds views), ``saved`` (``w`` at the
    start of the step), ``point`` (scratch: ``w + e``, ``w + eps``, the new ``w``) and ``grad``
    (scratch: a pass's gradients).  The ``*_views`` lists are in ``pairs`` order.  State already in
    ``state[p]`` (a loaded state dict, an earlier ``FlatState``) is copied in; a parameter without
    state gets ``s = s_init``, ``exp_avg = 0``, ``step = 0``.
    """

    def __init__(self, pairs: list, state: Any, s_init: float) -> None:
        self.pairs = pairs
        self.params = [p for _, p in pairs]
        where: dict[tuple, list[int]] = {}
        for i, (group, p) in enumerate(pairs):
            where.setdefault((id(group), p.dtype, p.device), []).append(i)
        self.buckets = [_Bucket(pairs[ix[0]][0], ix, [self.params[i] for i in ix]) for ix in where.values()]
        n = len(pairs)
        self.s_views: list[Any] = [None] * n
        self.m_views: list[Any] = [None] * n
        self.saved_views: list[Any] = [None] * n
        self.point_views: list[Any] = [None] * n
        for b in self.buckets:
            for name, flat in (("s", b.s), ("m", b.exp_avg), ("saved", b.saved), ("point", b.point)):
                out = getattr(self, f"{name}_views")
                for i, v in zip(b.pos, b.views(flat)):
                    out[i] = v
        with torch.no_grad():
            for p, sv, mv in zip(self.params, self.s_views, self.m_views):
                st = state[p]
                for key, view, fill in (("s", sv, s_init), ("exp_avg", mv, 0.0)):
                    old = st.get(key)
                    if old is None:
                        view.fill_(fill)
                    elif not isinstance(old, torch.Tensor) or old.shape != p.shape:
                        got = tuple(old.shape) if isinstance(old, torch.Tensor) else type(old).__name__
                        raise ValueError(
                            f"BayesianSAM: state[{key!r}] of a parameter of shape {tuple(p.shape)} has "
                            f"shape {got}; the state was saved for another model"
                        )
                    else:
                        view.copy_(old)
                st["s"], st["exp_avg"] = sv, mv
                st.setdefault("step", 0)

    def valid(self, pairs: list, state: Any) -> bool:
        """Are ``pairs`` the same parameters in the same groups, ``state[p]`` still the views?"""
        if len(pairs) != len(self.pairs):
            return False
        for (g, p), (g0, p0), sv, mv in zip(pairs, self.pairs, self.s_views, self.m_views):
            st = state.get(p)
            if (
                p is not p0
                or g is not g0
                or st is None
                or st.get("s") is not sv
                or st.get("exp_avg") is not mv
            ):
                return False
        return True

    def save(self) -> None:
        """``saved <- w``."""
        if self.params:
            torch._foreach_copy_(self.saved_views, self.params)

    def restore(self) -> None:
        """``w <- saved``."""
        if self.params:
            torch._foreach_copy_(self.params, self.saved_views)

    def write(self, only: list[int] | None = None) -> None:
        """``w <- point`` (for the parameters ``only``, by position, if given)."""
        if only is None:
            if self.params:
                torch._foreach_copy_(self.params, self.point_views)
        elif only:
            torch._foreach_copy_([self.params[i] for i in only], [self.point_views[i] for i in only])

    @staticmethod
    def gather(b: _Bucket, tensors: list[torch.Tensor | None], scratch: bool = False) -> torch.Tensor:
        """The bucket's entries of ``tensors`` (``pairs`` order; ``None``: zeros) as one flat tensor:
        ``b.grad`` with ``scratch=True`` where all are there (valid until the next gather), else new."""
        if scratch:
            own = [tensors[i] for i in b.pos]
            if all(t is not None for t in own):
                torch._foreach_copy_(b.grad_views, own)
                return b.grad
        parts = [
            b.saved.new_zeros(n) if tensors[i] is None else tensors[i].reshape(-1)  # type: ignore[union-attr]
            for i, n in zip(b.pos, b.numels)
        ]
        return torch.cat(parts)


class BSAMSplitStep(SplitProtocol):
    """Mixin of :class:`optimizers.BayesianSAM`: the pieces of a step and the split-step API."""

    _split: dict[str, Any] | None = None
    _flat_state: FlatState | None = None
    perturbed: bool = False  # between first_step() and the end of the step: at w + eps

    # ---- the flat state and the pieces, shared with the closure step ---------------------------
    def _flat(self) -> FlatState:
        """The :class:`FlatState` of the current trainable parameters (rebuilt when the parameters,
        their groups or ``state[p]``'s tensors changed, e.g. after ``load_state_dict``)."""
        pairs = self._params()
        fs = self._flat_state
        if fs is None or not fs.valid(pairs, self.state):
            fs = self._flat_state = FlatState(pairs, self.state, self.s_init)
        return fs

    def _noise_std(self, fs: FlatState) -> list[torch.Tensor]:
        """``1 / sqrt(N s)`` per bucket (read-only)."""
        n = float(self.num_data)
        return [b.derived("std", lambda s: torch.mul(s, n).rsqrt_()) for b in fs.buckets]

    def _add_noise(self, fs: FlatState) -> torch.Tensor:
        """``w <- saved + e`` with ``e = z / sqrt(N s)``, ``z`` drawn parameter by parameter
        (``param_groups`` order, as ``torch.randn(p.shape, ...)`` would) from the optimizer's
        generator; returns ``||e||``."""
        for v in fs.point_views:
            v.normal_(generator=self.generator)
        norms = []
        for b, sd in zip(fs.buckets, self._noise_std(fs)):
            norms.append(torch.linalg.vector_norm(b.point.mul_(sd)))
            b.point.add_(b.saved)
        fs.write()
        return _norm(norms)

    def _ascend(self, fs: FlatState, grads: list[torch.Tensor | None]) -> tuple | None:
        """``w <- saved + eps``, ``eps = rho g / s``, where a gradient was computed (``saved``
        elsewhere); ``(h = sqrt(s) |g| per bucket, ||eps||, ||g||)``, or ``None`` (and
        ``w <- saved``) without any gradient."""
        have = [g is not None for g in grads]
        if not any(have):
            fs.restore()
            return None
        hs, eps_n, g_n = [], [], []
        for b in fs.buckets:
            g = fs.gather(b, grads, scratch=True)
            eps = torch.mul(g, b.group["rho"], out=b.point).div_(b.s)
            eps_n.append(torch.linalg.vector_norm(eps))
            g_n.append(torch.linalg.vector_norm(g))
            b.point.add_(b.saved)
            hs.append(g.abs().mul_(b.derived("sqrt", torch.sqrt)))
        if all(have):
            fs.write()
        else:
            fs.restore()
            fs.write([i for i, h in enumerate(have) if h])
        return hs, _norm(eps_n), _norm(g_n)

    # ---- the split-step API (the protocol: optimizers.step_protocol) ----------------------------
    @property
    def step_state(self) -> str:
        return IDLE if self._split is None else self._split["state"]

    def _step_fix(self, state: str) -> str:
        if state == IDLE and self.noise:
            return (
                "begin a step with noise_step() before the first forward pass (bSAM takes its first "
                "gradient at the noisy point w + e; noise=False leaves the noise out)"
            )
        return super()._step_fix(state)

    def _points(self) -> tuple[str, str]:
        """Where the two passes' gradients are taken (for the non-finite gradient error)."""
        return ("at w + e" if self.noise else "at w", "at w + eps")

    def _check_m(self, name: str) -> None:
        if self.m != 1:
            raise ValueError(
                f"BayesianSAM.{name}: the split step takes one perturbation per step; with m={self.m} "
                "use step(closure) with closure(chunk)"
            )

    def _open_flat(self, call: str) -> FlatState:
        """The open step's :class:`FlatState`, refused if the parameters or the state changed."""
        fs = self._split["fs"]  # type: ignore[index]
        if not fs.valid(self._params(), self.state):
            raise StepOrderError(
                f"BayesianSAM.{call} refused: the parameters, their groups or the optimizer's state "
                "changed since the step began; undo the step with cancel_step()"
            )
        return fs

    def _close(self) -> dict[str, Any]:
        """End the open step: ``w`` and the BatchNorm statistics restored; the step's record."""
        state = self._split
        self._split, self.perturbed = None, False
        state["fs"].restore()  # type: ignore[index]
        bn_restore(state.get("snap", []))  # type: ignore[union-attr]
        return state  # type: ignore[return-value]

    @torch.no_grad()
    def noise_step(self) -> None:
        """``w <- w + e``, ``e ~ N(0, 1 / (N s))``: before the first forward pass of a split step."""
        self._expect("noise_step()", IDLE)
        self._check_m("noise_step")
        if not self.noise:
            raise RuntimeError(
                "BayesianSAM.noise_step: this optimizer was built with noise=False; call first_step()"
            )
        fs = self._flat()
        fs.save()
        noise = [self._add_noise(fs)] if fs.params else []
        self._split = {
            "state": NOISE,
            "fs": fs,
            "noise": noise,
            "marked": fs.params,
            "marks": grad_marks(fs.params),
        }

    @torch.no_grad()
    def first_step(self, zero_grad: bool = False) -> None:
        """From the gradients in ``p.grad`` (at ``w + e``, or ``w`` without noise): ``w`` restored,
        then ``w <- w + rho g / s``; ``zero_grad=True`` clears the gradients for the next pass.
        Refused, the step left open, when no backward pass wrote a gradient since :meth:`noise_step`."""
        self._expect("first_step()", NOISE if self.noise else IDLE)
        self._check_m("first_step")
        state = self._split
        if state is None:
            fs = self._flat()
            self._require_new_grads("first_step()", fs.params, "w")
            fs.save()
        else:
            fs = self._open_flat("first_step()")
            self._require_new_grads("first_step()", fs.params, "w + e", ("noise_step()", state["marks"]))
        grads = [p.grad for p in fs.params]
        snap = bn_snapshot(self.model)
        h, eps_n, g_n = self._ascend(fs, grads)  # type: ignore[misc]
        self._split = dict(
            state=OPEN,
            fs=fs,
            snap=snap,
            got=[g is not None for g in grads],
            h=h,
            noise=[] if state is None else state["noise"],
            eps=[eps_n],
            gnorm=[g_n],
        )
        self.perturbed = True
        if zero_grad:
            self.zero_grad()
        self._split.update(marked=fs.params, marks=grad_marks(fs.params))

    @torch.no_grad()
    def second_step(self, zero_grad: bool = False) -> None:
        """``w`` restored, then Alg. 1's update from the gradients in ``p.grad`` (at ``w + eps``).
        Refused, the step left open, when no backward pass wrote a gradient since :meth:`first_step`."""
        self._expect("second_step()", OPEN)
        fs = self._open_flat("second_step()")
        self._require_new_grads("second_step()", fs.params, "w + eps", ("first_step()", self._split["marks"]))
        state = self._close()
        grads = [p.grad for p in fs.params]
        g_eps = [fs.gather(b, grads, scratch=True) for b in fs.buckets]
        check_finite(self, state["gnorm"], g_eps, self._points())
        active = [a or g is not None for a, g in zip(state["got"], grads)]
        self._update(fs, g_eps, state["h"], active, set_grads=False)
        nan = fs.params[0].new_full((), float("nan")) if fs.params else torch.tensor(float("nan"))
        self._finish(fs, [nan], [nan], state["gnorm"], state["eps"], state["noise"])
        if zero_grad:
            self.zero_grad()

    @torch.no_grad()
    def cancel_step(self, zero_grad: bool = True) -> None:
        """Undo :meth:`noise_step` / :meth:`first_step` without an update."""
        self._expect("cancel_step()", NOISE, OPEN)
        self._close()
        if zero_grad:
            self.zero_grad()
