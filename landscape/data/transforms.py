"""Image transforms on batched tensors (no torchvision): the standard CIFAR augmentation and
per-channel normalisation.

* :func:`random_crop`: pad by ``padding`` pixels, then cut a random ``H x W`` window per image
  (``RandomCrop(32, padding=4)`` of He et al. 2016, Sec. 4.2: "4 pixels are padded on each side,
  and a 32x32 crop is randomly sampled from the padded image or its horizontal flip");
* :func:`random_hflip`: mirror each image left-right with probability ``p``;
* :func:`random_crop_flip` / :class:`RandomCropFlip`: both, drawn from a ``torch.Generator`` so a
  seed reproduces the whole augmentation stream; :class:`RandomCropFlip` is the per-batch callable
  to hand to :func:`landscape.models.train` (``transform=``);
* :func:`random_cutout`: Cutout (DeVries & Taylor 2017), a square zeroed at a random centre;
* :func:`normalize` / :func:`channel_stats`: ``(x - mean) / std`` per channel, with the published
  constants of :data:`landscape.data.common.CHANNEL_STATS` or statistics computed from a
  training set.

Padding value: torchvision pads the *raw* image with black pixels. The loaders here return
standardised inputs by default, where black is ``-mean / std`` per channel, not 0: pass
``fill=black_fill("cifar10")`` to reproduce torchvision exactly on standardised CIFAR-10 inputs
(``fill=0`` pads with the mean colour instead).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from landscape.data.common import CHANNEL_STATS

__all__ = [
    "RandomCropFlip",
    "black_fill",
    "channel_stats",
    "normalize",
    "random_crop",
    "random_crop_flip",
    "random_cutout",
    "random_hflip",
]


def _check_images(x: torch.Tensor, what: str) -> None:
    if not isinstance(x, torch.Tensor) or x.ndim != 4 or not x.is_floating_point():
        got = (
            f"{x.dtype} tensor of shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        )
        raise ValueError(f"{what}: expected a floating tensor of images [N, C, H, W], got {got}")


def _generator(generator: torch.Generator | int | None) -> torch.Generator | None:
    if generator is None or isinstance(generator, torch.Generator):
        return generator
    if isinstance(generator, bool) or not isinstance(generator, int):
        raise TypeError(f"generator must be a torch.Generator, an int seed or None, got {generator!r}")
    return torch.Generator().manual_seed(generator)


def _draw_device(gen: torch.Generator | None) -> torch.device:
    return gen.device if gen is not None else torch.device("cpu")


def black_fill(stats: str | tuple[Sequence[float], Sequence[float]]) -> tuple[float, ...]:
    """The value of a black pixel after standardisation, ``-mean / std`` per channel, for
    ``stats`` a name of :data:`CHANNEL_STATS` or a ``(mean, std)`` pair."""
    mean, std = CHANNEL_STATS[stats] if isinstance(stats, str) else stats
    return tuple(-float(m) / float(s) for m, s in zip(mean, std))


def _padded(x: torch.Tensor, padding: int, fill: float | Sequence[float]) -> torch.Tensor:
    n, c, h, w = x.shape
    out = x.new_empty(n, c, h + 2 * padding, w + 2 * padding)
    if isinstance(fill, (int, float)):
        out.fill_(float(fill))
    else:
        values = torch.as_tensor(list(fill), dtype=x.dtype, device=x.device)
        if values.numel() != c:
            raise ValueError(f"fill has {values.numel()} values for images with {c} channels")
        out.copy_(values.view(1, c, 1, 1).expand_as(out))
    out[:, :, padding : padding + h, padding : padding + w] = x
    return out


def random_crop(
    x: torch.Tensor,
    padding: int = 4,
    *,
    generator: torch.Generator | int | None = None,
    fill: float | Sequence[float] = 0.0,
    return_offsets: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Pad every image of ``x`` (``[N, C, H, W]``) by ``padding`` pixels of value ``fill`` on each
    side and cut an ``H x W`` window at a uniformly random offset ``(dy, dx)`` in
    ``{0, ..., 2 * padding}^2``, one per image.

    ``return_offsets=True`` also returns the ``[N, 2]`` int64 offsets ``(dy, dx)``: image ``i`` of
    the result is ``padded[i, :, dy:dy + H, dx:dx + W]``.
    """
    _check_images(x, "random_crop")
    if isinstance(padding, bool) or not isinstance(padding, int) or padding < 0:
        raise ValueError(f"padding must be a non-negative int (pixels on each side), got {padding!r}")
    gen = _generator(generator)
    n, _, h, w = x.shape
    offsets = torch.randint(0, 2 * padding + 1, (n, 2), generator=gen, device=_draw_device(gen))
    offsets = offsets.to(x.device)
    padded = _padded(x, padding, fill)
    rows = offsets[:, 0:1] + torch.arange(h, device=x.device)  # [N, H]
    cols = offsets[:, 1:2] + torch.arange(w, device=x.device)  # [N, W]
    idx = torch.arange(n, device=x.device)[:, None, None]
    out = padded[idx, :, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2).contiguous()
    return (out, offsets.cpu()) if return_offsets else out


def random_hflip(
    x: torch.Tensor,
    p: float = 0.5,
    *,
    generator: torch.Generator | int | None = None,
    return_mask: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Mirror each image of ``x`` left-right (last axis) with probability ``p``, independently;
    ``return_mask=True`` also returns the boolean ``[N]`` mask of the flipped images."""
    _check_images(x, "random_hflip")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"flip probability p must lie in [0, 1], got {p!r}")
    gen = _generator(generator)
    mask = torch.rand(x.shape[0], generator=gen, device=_draw_device(gen)) < p
    mask = mask.to(x.device)
    out = torch.where(mask[:, None, None, None], x.flip(-1), x)
    return (out, mask.cpu()) if return_mask else out


def random_crop_flip(
    x: torch.Tensor,
    padding: int = 4,
    flip_prob: float = 0.5,
    *,
    generator: torch.Generator | int | None = None,
    fill: float | Sequence[float] = 0.0,
) -> torch.Tensor:
    """:func:`random_crop` then :func:`random_hflip`, both drawing from ``generator`` (the
    standard CIFAR training augmentation with ``padding=4``, ``flip_prob=0.5``)."""
    gen = _generator(generator)
    out = random_crop(x, padding, generator=gen, fill=fill)
    return random_hflip(out, flip_prob, generator=gen)


class RandomCropFlip:
    """Per-batch augmentation with its own seeded generator: ``aug = RandomCropFlip(seed=0)``,
    then ``aug(x)`` for every batch (successive calls continue one reproducible stream).

    ``config`` records the settings (for a run's result file); ``state()`` / ``load_state()``
    save and restore the generator to resume a run exactly.
    """

    def __init__(
        self,
        padding: int = 4,
        flip_prob: float = 0.5,
        *,
        seed: int = 0,
        fill: float | Sequence[float] = 0.0,
    ):
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {seed!r}")
        if isinstance(padding, bool) or not isinstance(padding, int) or padding < 0:
            raise ValueError(f"padding must be a non-negative int (pixels on each side), got {padding!r}")
        if not 0.0 <= flip_prob <= 1.0:
            raise ValueError(f"flip probability must lie in [0, 1], got {flip_prob!r}")
        self.padding, self.flip_prob, self.seed = padding, float(flip_prob), seed
        self.fill = fill if isinstance(fill, (int, float)) else tuple(float(v) for v in fill)
        self.generator = torch.Generator().manual_seed(seed)

    @property
    def config(self) -> dict[str, Any]:
        return {
            "transform": "random_crop_flip",
            "padding": self.padding,
            "flip_prob": self.flip_prob,
            "seed": self.seed,
            "fill": list(self.fill) if isinstance(self.fill, tuple) else self.fill,
        }

    def state(self) -> torch.Tensor:
        return self.generator.get_state()

    def load_state(self, state: torch.Tensor) -> None:
        self.generator.set_state(state)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return random_crop_flip(x, self.padding, self.flip_prob, generator=self.generator, fill=self.fill)

    def __repr__(self) -> str:
        return f"RandomCropFlip(padding={self.padding}, flip_prob={self.flip_prob}, seed={self.seed})"


def channel_stats(x: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and population standard deviation over all images and pixels of ``x``
    (``[N, C, H, W]``), accumulated in float64: the "computed from the training set" statistics."""
    _check_images(x, "channel_stats")
    flat = x.detach().to(torch.float64).transpose(0, 1).reshape(x.shape[1], -1)
    mean = flat.mean(dim=1)
    std = flat.std(dim=1, correction=0)
    return tuple(mean.tolist()), tuple(std.tolist())


def normalize(
    x: torch.Tensor, mean: str | Sequence[float], std: Sequence[float] | None = None
) -> torch.Tensor:
    """``(x - mean) / std`` per channel; ``mean`` may name published statistics
    (``normalize(x, "cifar10")``, see :data:`CHANNEL_STATS`)."""
    _check_images(x, "normalize")
    if isinstance(mean, str):
        if mean not in CHANNEL_STATS:
            raise ValueError(f"unknown statistics {mean!r}; choose one of {sorted(CHANNEL_STATS)}")
        mean, std = CHANNEL_STATS[mean]
    if std is None:
        raise ValueError("normalize: give std with mean (or a statistics name)")
    m = torch.as_tensor(list(mean), dtype=x.dtype, device=x.device)
    s = torch.as_tensor(list(std), dtype=x.dtype, device=x.device)
    if m.numel() != x.shape[1] or s.numel() != x.shape[1]:
        raise ValueError(f"normalize: {m.numel()} means and {s.numel()} stds for {x.shape[1]} channels")
    if bool((s <= 0).any()):
        raise ValueError(f"normalize: standard deviations must be positive, got {list(std)}")
    return (x - m.view(1, -1, 1, 1)) / s.view(1, -1, 1, 1)


def random_cutout(
    x: torch.Tensor,
    size: int = 16,
    *,
    generator: torch.Generator | int | None = None,
    value: float = 0.0,
    return_centres: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Cutout (DeVries & Taylor 2017, arXiv:1708.04552): in every image of ``x`` (``[N, C, H, W]``)
    the pixels of rows ``[cy - size // 2, cy + size // 2)`` and columns ``[cx - size // 2, cx +
    size // 2)``, clipped at the border, are set to ``value`` (all channels), for a centre ``(cy,
    cx)`` uniform over the image, one per image (the authors' ``util/cutout.py``; the square may
    lie partly outside, so fewer than ``size^2`` pixels change near the border). Their code and the
    SAM code zero the square after standardisation (the mean colour): ``value = 0``; side 16 for
    CIFAR-10 (the SAM code's ``cutout_length``). ``return_centres=True`` also returns the ``[N, 2]``
    int64 centres ``(cy, cx)``."""
    _check_images(x, "random_cutout")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError(f"cutout size must be a non-negative int (the side in pixels), got {size!r}")
    gen = _generator(generator)
    n, _, h, w = x.shape
    draw = _draw_device(gen)
    cy = torch.randint(0, h, (n,), generator=gen, device=draw)
    cx = torch.randint(0, w, (n,), generator=gen, device=draw)
    centres = torch.stack([cy, cx], dim=1).to(x.device)
    rows = torch.arange(h, device=x.device).view(1, h, 1)
    cols = torch.arange(w, device=x.device).view(1, 1, w)
    half = size // 2
    ry, rx = centres[:, 0].view(n, 1, 1), centres[:, 1].view(n, 1, 1)
    inside = (rows >= ry - half) & (rows < ry + half) & (cols >= rx - half) & (cols < rx + half)
    out = x.masked_fill(inside.unsqueeze(1), float(value))
    return (out, centres.cpu()) if return_centres else out
