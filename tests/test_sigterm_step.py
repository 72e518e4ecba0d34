"""A SIGTERM inside an optimizer step stops the run after the step (landscape.cli_common
.interrupts_deferred): the two-pass step is never cut between perturbing and restoring the weights."""

from __future__ import annotations

import copy
import os
import signal

import pytest
import torch
from torch import nn

from landscape.cli_common import Terminated, interrupts_deferred, sigterm_raises_interrupt
from optimizers import SAM
from optimizers.perturbation import make_closure


def test_a_sigterm_inside_the_block_is_raised_when_the_block_ends() -> None:
    reached_end_of_block = False
    with sigterm_raises_interrupt():
        with pytest.raises(Terminated):
            with interrupts_deferred:
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(1000):  # the handler runs between bytecodes: give it many
                    pass
                reached_end_of_block = True
    assert reached_end_of_block
    assert interrupts_deferred.depth == 0 and not interrupts_deferred.pending


def test_outside_the_block_a_sigterm_raises_at_once() -> None:
    after = False
    with sigterm_raises_interrupt():
        with pytest.raises(Terminated):
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):
                pass
            after = True
    assert not after


def test_a_sam_step_interrupted_between_its_passes_completes_and_then_stops() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)).double()
    twin = copy.deepcopy(model)
    x = torch.randn(8, 4, dtype=torch.float64)
    y = torch.randint(0, 3, (8,))
    opt = SAM(model.parameters(), torch.optim.SGD, rho=0.05, lr=0.1, model=model)
    ref = SAM(twin.parameters(), torch.optim.SGD, rho=0.05, lr=0.1, model=twin)
    ref.step(make_closure(ref, twin, nn.CrossEntropyLoss(), x, y))

    original = opt._perturbation

    def perturbation_then_sigterm(pairs, grads):
        out = original(pairs, grads)
        os.kill(os.getpid(), signal.SIGTERM)  # arrives while the weights are about to be perturbed
        return out

    opt._perturbation = perturbation_then_sigterm
    with sigterm_raises_interrupt():
        with pytest.raises(Terminated):
            with interrupts_deferred:
                opt.step(make_closure(opt, model, nn.CrossEntropyLoss(), x, y))
    for a, b in zip(model.parameters(), twin.parameters()):  # the whole step, as if uninterrupted
        assert torch.equal(a, b)
    assert torch.is_grad_enabled()
