"""Batch augmentation for image tensors: random horizontal flips and zero-padded random crops.

The standard CIFAR augmentation (He et al. 2016, Sec. 4.2: "4 pixels are padded on each side, and a
32x32 crop is randomly sampled from the padded image or its horizontal flip"), applied to a whole
batch at once on the batch's device. The random choices are drawn on the CPU from the run's
augmentation generator, so a run gives the same augmented batches on every device and after a
resume.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["augment_batch"]


def augment_batch(x: torch.Tensor, kind: str, generator: torch.Generator, padding: int = 4) -> torch.Tensor:
    """Augment ``x`` (``[B, C, H, W]``): ``kind`` is ``"none"``, ``"flip"`` or ``"crop_flip"``.

    ``flip``: each image is mirrored left-right with probability 1/2. ``crop_flip``: each image is
    zero-padded by ``padding`` pixels on every side, a random ``H x W`` window is cut out (offsets
    uniform in ``0..2 padding``), then flipped as above. ``x`` itself is not modified.
    """
    if kind == "none":
        return x
    if kind not in ("flip", "crop_flip"):
        raise ValueError(f"augmentation must be 'none', 'flip' or 'crop_flip', got {kind!r}")
    if x.dim() != 4:
        raise ValueError(
            f"augmentation {kind!r} needs image batches [B, C, H, W], got shape {tuple(x.shape)}; use "
            'data.augmentation = "none" for flat inputs (or an image data set such as digits-image)'
        )
    b, c, h, w = x.shape
    out = x
    if kind == "crop_flip" and padding > 0:
        offsets = torch.randint(0, 2 * padding + 1, (2, b), generator=generator).to(x.device)
        padded = F.pad(x, (padding, padding, padding, padding))
        rows = (offsets[0][:, None] + torch.arange(h, device=x.device))[:, None, :, None]
        cols = (offsets[1][:, None] + torch.arange(w, device=x.device))[:, None, None, :]
        batch = torch.arange(b, device=x.device)[:, None, None, None]
        chans = torch.arange(c, device=x.device)[None, :, None, None]
        out = padded[batch, chans, rows, cols]
    flip = (torch.rand(b, generator=generator) < 0.5).to(x.device)
    return torch.where(flip[:, None, None, None], out.flip(-1), out)
