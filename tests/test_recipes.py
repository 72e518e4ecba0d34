"""The recipes of ``docs/recipes.md``, executed as written, against the plain closure loop.

* mixed precision with ``LossScaler`` (float16 autocast on the CPU) moves the weights as float32 SAM
  does, within float16 rounding; in float32 the clipped split-step loop equals the closure loop with
  the same clipping bit for bit;
* Lightning (manual optimization) and the HuggingFace ``Trainer`` (three steps, float64) reach the
  weights of the plain closure loop (the real packages; skipped without them, required in CI's
  peer stage).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn

from optimizers import SAM

RECIPES = Path(__file__).resolve().parents[1] / "docs" / "recipes.md"


def _recipe(name: str) -> dict:
    """Execute the code block of ``docs/recipes.md`` that defines ``name``; its namespace."""
    blocks = re.findall(r"```python\n(.*?)```", RECIPES.read_text(), re.S)
    code = next(b for b in blocks if f"def {name}(" in b)
    namespace: dict = {"__name__": f"recipe_{name}"}
    exec(compile(code, f"docs/recipes.md:{name}", "exec"), namespace)
    return namespace


def _net(dtype=torch.float32) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3)).to(dtype)


def _batches(n: int, dtype=torch.float32, size: int = 16) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(7)
    return [
        (torch.randn(size, 8, generator=g, dtype=dtype), torch.randint(0, 3, (size,), generator=g))
        for _ in range(n)
    ]


def _closure_loop(model, batches, max_norm=None) -> nn.Module:
    """The reference: ``SAM.step(closure)``, optionally clipping the second pass's gradient."""
    opt = SAM(model.parameters(), torch.optim.SGD, rho=0.05, lr=0.1, momentum=0.9, model=model)
    for x, y in batches:

        def closure(x=x, y=y):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            if max_norm is not None and opt.perturbed:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            return loss

        opt.step(closure)
    return model


def _max_rel(a: nn.Module, b: nn.Module) -> float:
    return max(
        float((p.detach() - q.detach()).norm() / q.detach().norm())
        for p, q in zip(a.parameters(), b.parameters())
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_mixed_precision_recipe_follows_float32_sam(dtype):
    batches = _batches(3)
    ref = _closure_loop(_net(), batches)
    amp = _recipe("train_amp")["train_amp"](_net(), batches, "cpu", dtype)
    start = _net()
    assert _max_rel(ref, start) > 1e-2  # the steps moved the weights ...
    assert _max_rel(amp, ref) < (5e-3 if dtype == torch.float16 else 3e-2)  # ... and AMP follows them


def test_clipped_split_step_recipe_equals_the_clipped_closure_loop_in_float32():
    batches = _batches(3)
    ref = _closure_loop(_net(), batches, max_norm=0.05)
    got = _recipe("train_amp_clipped")["train_amp_clipped"](_net(), batches, "cpu", torch.float32, 0.05)
    for p, q in zip(got.parameters(), ref.parameters()):
        assert torch.equal(p, q)
    unclipped = _closure_loop(_net(), batches)
    assert _max_rel(unclipped, ref) > 1e-3  # clipping at 0.05 did change the steps
    fp16 = _recipe("train_amp_clipped")["train_amp_clipped"](_net(), batches, "cpu", torch.float16, 0.05)
    assert _max_rel(fp16, ref) < 5e-3


def test_lightning_recipe_equals_the_plain_loop():
    pytest.importorskip("lightning")
    from torch.utils.data import DataLoader, TensorDataset

    batches = _batches(3, torch.float64)
    x, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=False)
    ref = _closure_loop(_net(torch.float64), batches)
    got = _recipe("train_lightning")["train_lightning"](_net(torch.float64), loader, 3)
    for p, q in zip(got.parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=0, atol=1e-14)
    assert _max_rel(ref, _net(torch.float64)) > 1e-2


class _HFStyle(nn.Module):
    """A model as the HuggingFace ``Trainer`` expects it: ``forward(x, labels) -> {"loss", "logits"}``."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x, labels=None):
        logits = self.net(x)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(logits, labels)
        return out


class _Dicts(torch.utils.data.Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


def test_hf_trainer_recipe_equals_the_plain_loop(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    ((x, y),) = _batches(1, torch.float64)
    # one batch is the whole data set: every step sees the same examples (in the Trainer's order;
    # the mean loss does not depend on it beyond float64 rounding)
    ref = _closure_loop(_net(torch.float64), [(x, y)] * 3)
    model = _HFStyle(_net(torch.float64))
    _recipe("train_hf")["train_hf"](model, _Dicts(x, y), 3, str(tmp_path))
    for p, q in zip(model.net.parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=0, atol=1e-12)
    assert _max_rel(ref, _net(torch.float64)) > 1e-2
