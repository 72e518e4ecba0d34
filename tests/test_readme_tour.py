"""The README's API tour runs as written (fewer epochs) and its numbers are right."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch

from tests import references as ref

ROOT = Path(__file__).resolve().parents[1]


def test_readme_api_tour(tmp_path, monkeypatch):
    readme = (ROOT / "README.md").read_text()
    code = re.search(r"## API tour\n\n```python\n(.*?)```", readme, re.S).group(1)
    assert "epochs=10" in code
    code = code.replace("epochs=10", "epochs=1")
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    exec(compile(code, "README tour", "exec"), ns)
    model, x, y = ns["model"], ns["x"], ns["y"]
    # top-5 Hessian eigenvalues against the dense float64 Hessian of an independent reference
    m64 = type(model)(model.sizes, model.activation).double()
    m64.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    h = ref.dense_hessian(m64, torch.nn.CrossEntropyLoss(), [(x.double(), y)], chunk_size=512)
    exact = torch.linalg.eigvalsh(h).flip(0)
    np.testing.assert_allclose(ns["top"].values.numpy(), exact[:5].numpy(), rtol=1e-4)
    # the trace's 99.9 % interval covers the exact trace
    lo, hi = ns["tr"].ci(0.999)
    assert lo <= float(torch.trace(h)) <= hi
    # the surface centre (0 is on the grid) is the model's loss
    surf = ns["surf"]
    i = int(np.argmin(np.abs(np.asarray(surf.xs))))
    with torch.no_grad():
        centre = float(torch.nn.functional.cross_entropy(model(x), y))
    assert abs(float(surf.loss[i, i]) - centre) <= 1e-5 * centre
    assert (tmp_path / "surface.npz").exists()
    assert ns["path"].path.shape == (151, 2)
