"""Models and data sets of the product benchmark (``bench_products.py``): networks people run.

* ``resnet20``: ResNet-20 (He et al. 2016, Sec. 4.2) on CIFAR-shaped data (3x32x32, 10 classes);
* ``wrn``: a WideResNet (Zagoruyko & Komodakis 2016, "Wide residual networks", Table 1): WRN-16-4
  from the model registry when one is registered, else :class:`WideResNet` built here;
* ``transformer``: a 2-layer, 4-head ``nn.TransformerEncoder`` on token sequences with an
  embedding, learned positions, mean pooling and a classification head;
* ``mlp``: a 784-1024-1024-10 ReLU MLP (1.86M parameters) on MNIST-shaped data.

Data are seeded random tensors of the right shapes (products do not depend on what the pixels
show); labels are uniform over the classes.  ``quick=True`` gives tiny versions for smoke runs.
BatchNorm runs in eval mode (running statistics), as every curvature library here assumes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from landscape.models import ResNet, available_models, model_factory

MODELS = ("resnet20", "wrn", "transformer", "mlp")


@dataclass
class Problem:
    """A model, a loss and one batch (``x``, ``y``) on the benchmark's device and dtype."""

    name: str
    model: nn.Module
    loss_fn: nn.Module
    x: torch.Tensor
    y: torch.Tensor
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def num_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters() if p.requires_grad)


class WideBlock(nn.Module):
    """Pre-activation wide block: BN-ReLU-conv3x3-BN-ReLU-conv3x3 plus (1x1-projected) shortcut."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.shortcut = (
            nn.Conv2d(cin, cout, 1, stride=stride, bias=False) if (stride != 1 or cin != cout) else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        o = F.relu(self.bn1(x))
        short = x if self.shortcut is None else self.shortcut(o)
        o = self.conv1(o)
        o = self.conv2(F.relu(self.bn2(o)))
        return o + short


class WideResNet(nn.Module):
    """WRN-``depth``-``k`` (Zagoruyko & Komodakis 2016): ``(depth - 4) / 6`` blocks per stage,
    widths ``16k, 32k, 64k``, no dropout."""

    def __init__(self, depth: int = 16, k: int = 4, num_classes: int = 10, in_channels: int = 3):
        super().__init__()
        if (depth - 4) % 6 != 0 or depth < 10:
            raise ValueError(f"WRN depth must be 6n + 4 with n >= 1, got {depth}")
        n = (depth - 4) // 6
        widths = [16, 16 * k, 32 * k, 64 * k]
        self.stem = nn.Conv2d(in_channels, widths[0], 3, padding=1, bias=False)
        blocks: list[nn.Module] = []
        cin = widths[0]
        for stage in range(3):
            for b in range(n):
                blocks.append(WideBlock(cin, widths[stage + 1], 2 if (stage > 0 and b == 0) else 1))
                cin = widths[stage + 1]
        self.blocks = nn.Sequential(*blocks)
        self.bn = nn.BatchNorm2d(cin)
        self.head = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        o = F.relu(self.bn(self.blocks(self.stem(x))))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(o, 1), 1))


class TokenTransformer(nn.Module):
    """Embedding + learned positions -> ``nn.TransformerEncoder`` -> mean pool -> linear head."""

    def __init__(self, vocab: int, d_model: int, heads: int, ff: int, layers: int, seq: int, classes: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(0.02 * torch.randn(seq, d_model))
        layer = nn.TransformerEncoderLayer(d_model, heads, ff, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.encoder(self.embed(tokens) + self.pos[: tokens.shape[1]])
        return self.head(h.mean(dim=1))


def _wrn(quick: bool) -> tuple[nn.Module, str]:
    for name in ("wrn16-4", "wrn16_4", "wrn-16-4", "wide_resnet16_4"):
        if name in available_models() and not quick:
            return model_factory(name, seed=0), f"registry:{name}"
    depth, k = (10, 1) if quick else (16, 4)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return WideResNet(depth, k), f"WRN-{depth}-{k} (benchmarks/_models.py)"


def make_problem(
    name: str,
    *,
    quick: bool = False,
    batch_size: int | None = None,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    seed: int = 0,
) -> Problem:
    """Build model + data ``name`` (one of ``MODELS``), seeded, on ``device``/``dtype``, in eval mode."""
    if name not in MODELS:
        raise ValueError(f"unknown benchmark model {name!r}; choose from {MODELS}")
    gen = torch.Generator().manual_seed(seed)
    info: dict[str, Any] = {}
    if name == "resnet20":
        if quick:
            model, info["arch"] = ResNet(blocks=(1, 1, 1), width=4), "ResNet(blocks=(1,1,1), width=4)"
        elif "resnet20" in available_models():
            model, info["arch"] = model_factory("resnet20", seed=0), "registry:resnet20"
        else:  # pragma: no cover - registry without resnet20
            model, info["arch"] = ResNet(blocks=(3, 3, 3), width=16), "ResNet(blocks=(3,3,3), width=16)"
        side, B = (16, 8) if quick else (32, 128)
        x = torch.randn(batch_size or B, 3, side, side, generator=gen)
        classes = 10
    elif name == "wrn":
        model, info["arch"] = _wrn(quick)
        side, B = (16, 8) if quick else (32, 32)
        x = torch.randn(batch_size or B, 3, side, side, generator=gen)
        classes = 10
    elif name == "transformer":
        vocab, d, ff, seq, B = (50, 16, 32, 8, 8) if quick else (1000, 64, 256, 32, 64)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = TokenTransformer(vocab, d, 4, ff, 2, seq, 10)
        info["arch"] = f"TransformerEncoder(2 layers, 4 heads, d={d}, ff={ff}), vocab {vocab}, seq {seq}"
        info["attention"] = math_attention()
        x = torch.randint(0, vocab, (batch_size or B, seq), generator=gen)
        classes = 10
    else:
        sizes, B = ((32, 16, 16, 10), 16) if quick else ((784, 1024, 1024, 10), 128)
        model = model_factory("mlp", seed=0, sizes=sizes, activation="relu")
        info["arch"] = f"MLP {'-'.join(map(str, sizes))} ReLU"
        x = torch.randn(batch_size or B, sizes[0], generator=gen)
        classes = 10
    y = torch.randint(0, classes, (x.shape[0],), generator=gen)
    model = model.to(device=device, dtype=dtype).eval()
    x = x.to(device=device, dtype=dtype) if x.is_floating_point() else x.to(device)
    info["batch_size"] = int(x.shape[0])
    return Problem(name, model, nn.CrossEntropyLoss(), x, y.to(device), info)


def math_attention() -> str:
    """Differentiable attention for every library (process-wide): the fused inference path of
    ``nn.MultiheadAttention`` has no functorch rules, and the flash / memory-efficient
    scaled-dot-product kernels have no double backward (``derivative for
    aten::_scaled_dot_product_flash_attention_for_cpu_backward is not implemented`` in torch 2.13),
    which every double-backward HVP needs.  Switches both off; returns a note for the results."""
    backend = getattr(torch.backends, "mha", None)
    if backend is not None and hasattr(backend, "set_fastpath_enabled"):
        backend.set_fastpath_enabled(False)
    for flag in ("enable_flash_sdp", "enable_mem_efficient_sdp", "enable_cudnn_sdp"):
        if hasattr(torch.backends.cuda, flag):
            getattr(torch.backends.cuda, flag)(False)
    return "math SDPA, no MHA fast path (flash SDPA has no double backward)"
