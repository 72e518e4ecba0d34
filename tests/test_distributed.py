"""Two gloo processes on CPU reproduce the single-process loss, gradient and curvature matvecs."""

from __future__ import annotations

import os
import socket
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import landscape as ls
from landscape.distributed import DistributedObjective, shard
from tests import references as ref


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _problem():
    model = ref.make_cnn_bn()
    model.eval()
    x, y = ref.make_classification_data(23, image=True)
    V = torch.randn(sum(p.numel() for p in model.parameters()), 3, generator=torch.Generator().manual_seed(1))
    return model, nn.CrossEntropyLoss(), x, y, V.double()


def _compute(obj, V) -> dict[str, torch.Tensor]:
    loss, grad = obj.loss_and_gradient()
    ev = obj.evaluate()
    return {
        "loss": obj.loss(),
        "loss2": loss,
        "grad": grad,
        "acc": torch.tensor(ev["accuracy"]),
        "H": ls.hessian(obj) @ V,
        "H_fwd": ls.hessian(obj, engine="forward_over_reverse") @ V,
        "G": ls.ggn(obj) @ V,
        "F": ls.empirical_fisher(obj) @ V,
        "N": torch.tensor(obj.num_examples),
    }


def _worker(rank: int, world: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        model, loss, x, y, V = _problem()
        local = shard((x, y))  # 12 / 11 examples
        batches = ref.split_batches(*local, [5, len(local[1]) - 5] if rank == 0 else [len(local[1])])
        obj = DistributedObjective(model, loss, batches)
        res = _compute(obj, V)
        res["local_N"] = torch.tensor(obj.local_num_examples)
        torch.save(res, os.path.join(out, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two spawned gloo processes: 15 s on an idle 2-core machine, minutes under load
@pytest.mark.distributed
def test_two_gloo_processes_match_single_process():
    model, loss, x, y, V = _problem()
    single = _compute(ls.Objective(model, loss, ref.split_batches(x, y, [7, 16])), V)
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_worker, args=(2, _free_port(), out), nprocs=2, join=True)
        results = [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(2)]
    assert [int(r["local_N"]) for r in results] == [12, 11]
    for res in results:
        assert int(res["N"]) == 23
        for key in ["loss", "loss2", "grad", "acc", "H", "H_fwd", "G", "F"]:
            err = float((res[key] - single[key]).norm() / single[key].norm())
            assert err <= 1e-10, (key, err)


def test_shard_helper():
    x, y = ref.make_classification_data(10)
    parts = [shard((x, y), r, 3) for r in range(3)]
    assert [len(p[1]) for p in parts] == [4, 3, 3]
    assert torch.equal(torch.cat([p[0] for p in parts]), x)
    d = shard(({"a": x, "b": x[:, :2]}, y), 1, 2)
    assert torch.equal(d[0]["a"], x[5:]) and torch.equal(d[0]["b"], x[5:, :2]) and torch.equal(d[1], y[5:])
    batches = ref.split_batches(x, y, [2, 2, 2, 4])
    assert [len(b[1]) for b in shard(batches, 1, 2)] == [2, 4]
    ds = torch.utils.data.TensorDataset(x, y)
    sub = shard(ds, 0, 3)
    assert len(sub) == 4 and torch.equal(sub[3][0], x[3])
    with pytest.raises(ValueError, match="init_process_group"):
        shard((x, y))
    with pytest.raises(ValueError, match="rank must lie"):
        shard((x, y), 3, 3)
    with pytest.raises(ValueError, match="init_process_group"):
        DistributedObjective(ref.make_mlp(), nn.CrossEntropyLoss(), (x, y))
