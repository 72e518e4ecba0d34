"""bSAM in parts: ``noise_step`` / ``first_step`` / ``second_step`` around the caller's own passes.

The split-step interface of the SAM family (:mod:`optimizers.split_step`) for
:class:`optimizers.BayesianSAM`, whose first gradient is taken at the noisy point ``w + e``
(Moellenhoff & Khan 2023, Alg. 1, line 3)::

    opt.noise_step()                          # w <- w + e, e ~ N(0, 1 / (N s)) (noise=True only)
    loss_fn(model(x), y).backward()           # g at w + e
    opt.first_step(zero_grad=True)            # w <- w + rho g / s
    loss_fn(model(x), y).backward()           # g_eps
    opt.second_step(zero_grad=True)           # w restored; momentum, s and w updated

The update equals ``step(closure)``'s (m = 1) bit for bit: the same helpers run the same
operations in the same order (``tests/test_split_step.py``). The passes' losses are the caller's,
so ``last["loss"]`` and ``last["loss_perturbed"]`` are NaN after a split step.
"""

from __future__ import annotations

from typing import Any

import torch

from optimizers.bn_state import bn_restore, bn_snapshot

__all__ = ["BSAMSplitStep", "sum_sq"]


def sum_sq(tensors: list[torch.Tensor]) -> torch.Tensor:
    """``sum_i ||t_i||^2`` as a 0-d tensor (one ``foreach`` norm, no host read)."""
    return torch.stack(torch._foreach_norm(tensors)).square().sum()


class BSAMSplitStep:
    """Mixin of :class:`optimizers.BayesianSAM`: the pieces of a step and the split-step API."""

    _split: dict[str, Any] | None = None

    # ---- the pieces, shared with the closure step ----------------------------------------------
    def _noise_std(self, s_list: list[torch.Tensor]) -> list[torch.Tensor]:
        """``1 / sqrt(N s)`` per parameter."""
        return torch._foreach_rsqrt(torch._foreach_mul(s_list, float(self.num_data)))

    def _add_noise(self, params: list[torch.Tensor], std: list[torch.Tensor]) -> torch.Tensor:
        """``w <- w + e`` with ``e = std * z``, ``z`` drawn parameter by parameter from the
        optimizer's generator; returns ``||e||^2``."""
        e = [torch.randn(p.shape, generator=self.generator, dtype=p.dtype, device=p.device) for p in params]
        torch._foreach_mul_(e, std)
        torch._foreach_add_(params, e)
        return sum_sq(e)

    def _ascend(
        self, pairs: list, s_list: list[torch.Tensor], idx: list[int], grads: list[torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``w <- w + eps`` with ``eps = rho g / s`` for the parameters ``idx``; ``(||eps||^2, ||g||)``."""
        eps = torch._foreach_mul(grads, [pairs[i][0]["rho"] for i in idx])
        torch._foreach_div_(eps, [s_list[i] for i in idx])
        torch._foreach_add_([pairs[i][1] for i in idx], eps)
        return sum_sq(eps), sum_sq(grads).sqrt()

    @staticmethod
    def _curvature(
        sqrt_s: list[torch.Tensor], idx: list[int], grads: list[torch.Tensor]
    ) -> list[torch.Tensor]:
        """``h = sqrt(s) |g|`` for the parameters ``idx``."""
        if not idx:
            return []
        return torch._foreach_mul([sqrt_s[i] for i in idx], torch._foreach_abs(grads))

    # ---- the split-step API ----------------------------------------------------------------------
    def _split_start(self, name: str) -> tuple[list, list[torch.Tensor], list[torch.Tensor]]:
        if self.m != 1:
            raise ValueError(
                f"BayesianSAM.{name}: the split step takes one perturbation per step; with m={self.m} "
                "use step(closure) with closure(chunk)"
            )
        pairs = self._params()
        return pairs, [p for _, p in pairs], [self._s(p) for _, p in pairs]

    @torch.no_grad()
    def noise_step(self) -> None:
        """``w <- w + e``, ``e ~ N(0, 1 / (N s))``: before the first forward pass of a split step."""
        pairs, params, s_list = self._split_start("noise_step")
        if self._split is not None:
            raise RuntimeError(
                "BayesianSAM.noise_step: a step is already under way; finish it with second_step()"
            )
        if not self.noise:
            raise RuntimeError(
                "BayesianSAM.noise_step: this optimizer was built with noise=False; call first_step()"
            )
        saved = [p.detach().clone() for p in params]
        zero = params[0].new_zeros(()) if params else torch.zeros(())
        noise_sq = zero + self._add_noise(params, self._noise_std(s_list)) if params else zero
        self._split = {"stage": "noise", "saved": saved, "noise_sq": noise_sq}

    @torch.no_grad()
    def first_step(self, zero_grad: bool = False) -> None:
        """From the gradients in ``p.grad`` (at ``w + e``, or ``w`` without noise): ``w`` restored,
        then ``w <- w + rho g / s``; ``zero_grad=True`` clears the gradients for the next pass."""
        pairs, params, s_list = self._split_start("first_step")
        state = self._split
        if self.noise and (state is None or state["stage"] != "noise"):
            raise RuntimeError(
                "BayesianSAM.first_step: bSAM takes its first gradient at the noisy point w + e; call "
                "opt.noise_step() before the first forward pass (or build the optimizer with noise=False)"
            )
        if state is not None and state["stage"] != "noise":
            raise RuntimeError("BayesianSAM.first_step called twice; finish the step with second_step()")
        zero = params[0].new_zeros(()) if params else torch.zeros(())
        if state is None:
            saved, noise_sq = [p.detach().clone() for p in params], zero
        else:
            saved, noise_sq = state["saved"], state["noise_sq"]
            if params:
                torch._foreach_copy_(params, saved)
        idx = [i for i, p in enumerate(params) if p.grad is not None]
        if not idx:
            self._split = None
            raise RuntimeError("BayesianSAM.first_step needs the gradients: call loss.backward() before it")
        grads = [params[i].grad for i in idx]
        snap = bn_snapshot(self.model)
        e2, g_norm = self._ascend(pairs, s_list, idx, grads)
        h = self._curvature(torch._foreach_sqrt(s_list), idx, grads)
        self._split = dict(
            stage="ascent",
            saved=saved,
            snap=snap,
            idx=idx,
            h=h,
            noise_sq=noise_sq,
            eps_sq=zero + e2,
            gnorm=zero + g_norm,
        )
        self.perturbed = True
        if zero_grad:
            self.zero_grad()

    def _split_restore(self, name: str) -> dict[str, Any]:
        state = self._split
        if state is None or state["stage"] == "noise" and name == "second_step":
            raise RuntimeError(f"BayesianSAM.{name} without first_step(): call first_step() first")
        self._split, self.perturbed = None, False
        params = [p for _, p in self._params()]
        if params:
            torch._foreach_copy_(params, state["saved"])
        bn_restore(state.get("snap", []))
        return state

    @torch.no_grad()
    def second_step(self, zero_grad: bool = False) -> None:
        """``w`` restored, then Alg. 1's update from the gradients in ``p.grad`` (at ``w + eps``)."""
        pairs, params, s_list = self._split_start("second_step")
        state = self._split_restore("second_step")
        g_eps_sum = [p.grad for p in params]
        h_sum: list[torch.Tensor | None] = [None] * len(params)
        for i, hi in zip(state["idx"], state["h"]):
            h_sum[i] = hi
        nan = params[0].new_full((), float("nan")) if params else torch.tensor(float("nan"))
        sums = dict(g_eps_sum=g_eps_sum, h_sum=h_sum, losses=[nan], losses_eps=[nan])
        sums.update({k: state[k] for k in ("eps_sq", "noise_sq", "gnorm")})
        self._finish(pairs, s_list, sums)
        if zero_grad:
            self.zero_grad()

    @torch.no_grad()
    def cancel_step(self, zero_grad: bool = True) -> None:
        """Undo :meth:`noise_step` / :meth:`first_step` without an update."""
        self._split_restore("cancel_step")
        if zero_grad:
            self.zero_grad()
