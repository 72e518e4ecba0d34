"""AutoAugment (Cubuk et al. 2019, "AutoAugment: Learning Augmentation Strategies from Data",
CVPR) on a batch of images on the device, one sub-policy drawn per image.

* :data:`POLICIES`: the published policies, ``"cifar10"`` (found on reduced CIFAR-10, the paper's
  appendix table: 25 sub-policies of two operations), ``"imagenet"`` and ``"svhn"`` (25 each), as
  ``(operation, probability, magnitude level)`` triples; the level is ``None`` for the operations
  without a magnitude (AutoContrast, Equalize, Invert), whose level the table's readers ignore;
* :func:`autoaugment`: for every image of ``x`` (``[N, C, H, W]``, float in ``[0, 1]``) one
  sub-policy uniformly at random, then each of its two operations with its probability, all drawn
  from one ``torch.Generator``;
* :class:`AutoAugment`: the per-batch callable with its own seeded generator (like
  :class:`landscape.data.transforms.RandomCropFlip`).

Domain. The policies were searched with PIL on 8-bit images (the authors' code,
``tensorflow/models/research/autoaugment/augmentation_transforms.py``), so the batch is quantised
to the 256 grey levels ``round(255 x)`` first, every operation works on those levels in floating
point and rounds/truncates its result as PIL does (equalize, solarize, posterize, invert and the
grey conversion of Color are then exact; the blends and the smoothing kernel agree with PIL up
to one level where PIL's own rounding of a product lands on the other side of an integer), and
the result is divided by 255. Inputs that were standardised must be un-standardised first
(``x * std + mean``) and standardised again afterwards: :class:`AutoAugment` does this when given
``mean`` / ``std``.

Magnitudes (level ``m`` in ``0..9``), as in the authors' reference code (``PARAMETER_MAX = 10``;
the same scale as the TPU/SAM implementation): ShearX/Y ``+-0.3 m/10`` (about the top-left corner,
PIL ``AFFINE (1, s, 0, 0, 1, 0)``); TranslateX/Y ``+-int(m * T / 10)`` pixels with ``T = 10`` for
32-pixel images (``10 * W / 32`` otherwise); Rotate ``+-int(3 m)`` degrees about the centre; the
sign of each is ``+`` or ``-`` with probability 1/2; Solarize inverts levels ``>= 256 -
int(25.6 m)``; Posterize keeps ``4 - int(0.4 m)`` bits; Color, Contrast, Brightness, Sharpness
blend with their degenerate image by the factor ``0.1 + 0.18 m`` (PIL ``ImageEnhance``). The
geometric operations sample the nearest pixel (PIL's default) and fill what falls outside with
``fill`` (a level in ``[0, 1]``, per channel or one value; the authors' code ends with the mean
colour there, torchvision and PIL with black).

Why our own and not kornia's ``kornia.augmentation.auto.AutoAugment`` (measured in
``benchmarks/bench_augment.py``, ``benchmarks/results/augment_cpu.json``): kornia draws ONE
sub-policy per call for the whole batch, where the paper (and the authors' code) draws one per
image; kornia samples each magnitude inside an interval around its bin and uses bilinear sampling
and the ``m / 9`` scale, so it is not the published augmentation; and it would be a dependency
that pulls torch, which the CI install cannot take. This module is plain tensor code that runs on
the batch's device. Two ways to apply an operation to the images that drew it, chosen once by the
device: on the CPU the images are gathered (``nonzero``, free there) and only they are transformed,
so each image costs its own at most two operations; on an accelerator every operation of the
policy is computed for the whole batch and selected per image with ``torch.where``, which reads
nothing back to the host (no synchronisation in the training step).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = [
    "OPERATIONS",
    "POLICIES",
    "AutoAugment",
    "apply_operation",
    "autoaugment",
    "standardised_autoaugment",
]

#: The 14 operations of the found policies (the paper's Table 1 search space less Cutout and
#: SamplePairing, which no published sub-policy uses).
OPERATIONS = (
    "ShearX",
    "ShearY",
    "TranslateX",
    "TranslateY",
    "Rotate",
    "AutoContrast",
    "Invert",
    "Equalize",
    "Solarize",
    "Posterize",
    "Contrast",
    "Color",
    "Brightness",
    "Sharpness",
)
_NO_MAGNITUDE = ("AutoContrast", "Invert", "Equalize")
_OP_ID = {name: i for i, name in enumerate(OPERATIONS)}

Triple = tuple[str, float, "int | None"]

#: The published policies (Cubuk et al. 2019, appendix): 25 sub-policies of two operations each.
POLICIES: dict[str, tuple[tuple[Triple, Triple], ...]] = {
    "cifar10": (
        (("Invert", 0.1, None), ("Contrast", 0.2, 6)),
        (("Rotate", 0.7, 2), ("TranslateX", 0.3, 9)),
        (("Sharpness", 0.8, 1), ("Sharpness", 0.9, 3)),
        (("ShearY", 0.5, 8), ("TranslateY", 0.7, 9)),
        (("AutoContrast", 0.5, None), ("Equalize", 0.9, None)),
        (("ShearY", 0.2, 7), ("Posterize", 0.3, 7)),
        (("Color", 0.4, 3), ("Brightness", 0.6, 7)),
        (("Sharpness", 0.3, 9), ("Brightness", 0.7, 9)),
        (("Equalize", 0.6, None), ("Equalize", 0.5, None)),
        (("Contrast", 0.6, 7), ("Sharpness", 0.6, 5)),
        (("Color", 0.7, 7), ("TranslateX", 0.5, 8)),
        (("Equalize", 0.3, None), ("AutoContrast", 0.4, None)),
        (("TranslateY", 0.4, 3), ("Sharpness", 0.2, 6)),
        (("Brightness", 0.9, 6), ("Color", 0.2, 8)),
        (("Solarize", 0.5, 2), ("Invert", 0.0, None)),
        (("Equalize", 0.2, None), ("AutoContrast", 0.6, None)),
        (("Equalize", 0.2, None), ("Equalize", 0.6, None)),
        (("Color", 0.9, 9), ("Equalize", 0.6, None)),
        (("AutoContrast", 0.8, None), ("Solarize", 0.2, 8)),
        (("Brightness", 0.1, 3), ("Color", 0.7, 0)),
        (("Solarize", 0.4, 5), ("AutoContrast", 0.9, None)),
        (("TranslateY", 0.9, 9), ("TranslateY", 0.7, 9)),
        (("AutoContrast", 0.9, None), ("Solarize", 0.8, 3)),
        (("Equalize", 0.8, None), ("Invert", 0.1, None)),
        (("TranslateY", 0.7, 9), ("AutoContrast", 0.9, None)),
    ),
    "imagenet": (
        (("Posterize", 0.4, 8), ("Rotate", 0.6, 9)),
        (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
        (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
        (("Posterize", 0.6, 7), ("Posterize", 0.6, 6)),
        (("Equalize", 0.4, None), ("Solarize", 0.2, 4)),
        (("Equalize", 0.4, None), ("Rotate", 0.8, 8)),
        (("Solarize", 0.6, 3), ("Equalize", 0.6, None)),
        (("Posterize", 0.8, 5), ("Equalize", 1.0, None)),
        (("Rotate", 0.2, 3), ("Solarize", 0.6, 8)),
        (("Equalize", 0.6, None), ("Posterize", 0.4, 6)),
        (("Rotate", 0.8, 8), ("Color", 0.4, 0)),
        (("Rotate", 0.4, 9), ("Equalize", 0.6, None)),
        (("Equalize", 0.0, None), ("Equalize", 0.8, None)),
        (("Invert", 0.6, None), ("Equalize", 1.0, None)),
        (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
        (("Rotate", 0.8, 8), ("Color", 1.0, 2)),
        (("Color", 0.8, 8), ("Solarize", 0.8, 7)),
        (("Sharpness", 0.4, 7), ("Invert", 0.6, None)),
        (("ShearX", 0.6, 5), ("Equalize", 1.0, None)),
        (("Color", 0.4, 0), ("Equalize", 0.6, None)),
        (("Equalize", 0.4, None), ("Solarize", 0.2, 4)),
        (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
        (("Invert", 0.6, None), ("Equalize", 1.0, None)),
        (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
        (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
    ),
    "svhn": (
        (("ShearX", 0.9, 4), ("Invert", 0.2, None)),
        (("ShearY", 0.9, 8), ("Invert", 0.7, None)),
        (("Equalize", 0.6, None), ("Solarize", 0.6, 6)),
        (("Invert", 0.9, None), ("Equalize", 0.6, None)),
        (("Equalize", 0.6, None), ("Rotate", 0.9, 3)),
        (("ShearX", 0.9, 4), ("AutoContrast", 0.8, None)),
        (("ShearY", 0.9, 8), ("Invert", 0.4, None)),
        (("ShearY", 0.9, 5), ("Solarize", 0.2, 6)),
        (("Invert", 0.9, None), ("AutoContrast", 0.8, None)),
        (("Equalize", 0.6, None), ("Rotate", 0.9, 3)),
        (("ShearX", 0.9, 4), ("Solarize", 0.3, 3)),
        (("ShearY", 0.8, 8), ("Invert", 0.7, None)),
        (("Equalize", 0.9, None), ("TranslateY", 0.6, 6)),
        (("Invert", 0.9, None), ("Equalize", 0.6, None)),
        (("Contrast", 0.3, 3), ("Rotate", 0.8, 4)),
        (("Invert", 0.8, None), ("TranslateY", 0.0, 2)),
        (("ShearY", 0.7, 6), ("Solarize", 0.4, 8)),
        (("Invert", 0.6, None), ("Rotate", 0.8, 4)),
        (("ShearY", 0.3, 7), ("TranslateX", 0.9, 3)),
        (("ShearX", 0.1, 6), ("Invert", 0.6, None)),
        (("Solarize", 0.7, 2), ("TranslateY", 0.6, 7)),
        (("ShearY", 0.8, 4), ("Invert", 0.8, None)),
        (("ShearX", 0.7, 9), ("TranslateY", 0.8, 3)),
        (("ShearY", 0.8, 5), ("AutoContrast", 0.7, None)),
        (("ShearX", 0.7, 2), ("Invert", 0.1, None)),
    ),
}

_PARAMETER_MAX = 10  # the authors' level scale: value = level * maxval / 10


# --------------------------------------------------------------------------- the operations
# All take v: [N, C, H, W] float holding levels 0..255, and per-image parameters [N].


def _blend(degenerate: torch.Tensor, v: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """PIL ``Image.blend(degenerate, v, factor)`` on 8-bit images: ``d + f (v - d)`` clipped to
    ``[0, 255]`` and truncated (libImaging ``Blend.c``)."""
    f = factor.view(-1, 1, 1, 1)
    return (degenerate + f * (v - degenerate)).clamp(0.0, 255.0).floor()


def _grey(v: torch.Tensor) -> torch.Tensor:
    """PIL ``convert("L")``: ``(19595 R + 38470 G + 7471 B + 2^15) >> 16`` (ITU-R 601-2 luma in
    16-bit fixed point), ``[N, 1, H, W]``; a one-channel image is its own grey."""
    if v.shape[1] == 1:
        return v
    w = torch.tensor([19595.0, 38470.0, 7471.0], dtype=v.dtype, device=v.device).view(1, 3, 1, 1)
    return torch.floor(((v * w).sum(1, keepdim=True) + 32768.0) / 65536.0)


def _affine_nearest(v: torch.Tensor, coeffs: torch.Tensor, fill: torch.Tensor) -> torch.Tensor:
    """PIL ``Image.transform(size, AFFINE, (a, b, c, d, e, f))`` with nearest sampling: output pixel
    ``(x, y)`` takes input ``(floor(a (x+.5) + b (y+.5) + c), floor(d (x+.5) + e (y+.5) + f))``,
    ``fill`` where that lies outside. ``coeffs``: ``[N, 6]`` (float64 for PIL's double precision)."""
    n, c, h, w = v.shape
    cf = coeffs.to(device=v.device, dtype=torch.float64)
    ys = torch.arange(h, device=v.device, dtype=torch.float64).view(1, h, 1) + 0.5
    xs = torch.arange(w, device=v.device, dtype=torch.float64).view(1, 1, w) + 0.5
    a, b, cc, d, e, f = (cf[:, i].view(n, 1, 1) for i in range(6))
    xin = torch.floor(a * xs + b * ys + cc)
    yin = torch.floor(d * xs + e * ys + f)
    inside = (xin >= 0) & (xin < w) & (yin >= 0) & (yin < h)
    flat = (yin.clamp(0, h - 1) * w + xin.clamp(0, w - 1)).long().view(n, 1, h * w).expand(n, c, h * w)
    out = v.reshape(n, c, h * w).gather(2, flat).view(n, c, h, w)
    return torch.where(inside.unsqueeze(1), out, fill.view(1, -1, 1, 1).to(v.dtype))


def _rotate_coeffs(degrees: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """PIL ``Image.rotate(degrees)`` (counter-clockwise about the centre ``(w/2, h/2)``) as the
    inverse affine map of :func:`_affine_nearest`."""
    t = -torch.deg2rad(degrees.to(torch.float64))
    cos, sin = torch.cos(t), torch.sin(t)
    cx, cy = w / 2.0, h / 2.0
    c = cos * (-cx) + sin * (-cy) + cx
    f = -sin * (-cx) + cos * (-cy) + cy
    return torch.stack([cos, sin, c, -sin, cos, f], dim=1)


def _autocontrast(v: torch.Tensor) -> torch.Tensor:
    """PIL ``ImageOps.autocontrast`` (cutoff 0): each channel's range ``[lo, hi]`` stretched to
    ``[0, 255]`` by ``int(v * scale + offset)``, ``scale = 255 / (hi - lo)``, ``offset = -lo *
    scale``, in double precision as PIL computes its look-up table; a constant channel is kept."""
    v64 = v.to(torch.float64)
    lo = v64.amin(dim=(2, 3), keepdim=True)
    hi = v64.amax(dim=(2, 3), keepdim=True)
    span = hi - lo
    scale = 255.0 / span.clamp_min(1.0)
    stretched = torch.floor(v64 * scale + (-lo * scale)).clamp(0.0, 255.0)
    return torch.where(span > 0, stretched, v64).to(v.dtype)


def _equalize(v: torch.Tensor) -> torch.Tensor:
    """PIL ``ImageOps.equalize`` per channel: ``step = (count - count of the top level) // 255``,
    ``lut[i] = (step // 2 + #pixels below i) // step``; identity when ``step == 0`` (integer, exact)."""
    n, c, h, w = v.shape
    idx = v.reshape(n, c, h * w).long().clamp(0, 255)
    hist = torch.zeros(n, c, 256, dtype=torch.long, device=v.device)
    hist.scatter_add_(2, idx, torch.ones_like(idx))
    top = idx.amax(dim=2, keepdim=True)
    step = (h * w - hist.gather(2, top)) // 255  # [N, C, 1]
    below = torch.cumsum(hist, dim=2) - hist
    lut = torch.div(step // 2 + below, step.clamp_min(1), rounding_mode="floor").clamp(max=255)
    out = lut.gather(2, idx).to(v.dtype).view(n, c, h, w)
    return torch.where((step > 0).view(n, c, 1, 1), out, v)


def _smooth(v: torch.Tensor) -> torch.Tensor:
    """PIL ``ImageFilter.SMOOTH`` (3x3 kernel ``[[1,1,1],[1,5,1],[1,1,1]] / 13``, rounded), the
    one-pixel border kept from the input: Sharpness' degenerate image."""
    n, c, h, w = v.shape
    if h < 3 or w < 3:
        return v
    k = torch.ones(3, 3, dtype=v.dtype, device=v.device)
    k[1, 1] = 5.0
    k = (k / 13.0).expand(c, 1, 3, 3)
    inner = torch.floor(torch.nn.functional.conv2d(v, k, groups=c) + 0.5).clamp(0.0, 255.0)
    out = v.clone()
    out[:, :, 1:-1, 1:-1] = inner
    return out


def apply_operation(
    v: torch.Tensor,
    name: str,
    level: torch.Tensor | int,
    sign: torch.Tensor | float = 1.0,
    *,
    fill: torch.Tensor | float | Sequence[float] = 0.0,
) -> torch.Tensor:
    """Operation ``name`` of :data:`OPERATIONS` at magnitude ``level`` (``0..9``, one per image or
    one for all) on ``v``: a ``[N, C, H, W]`` float tensor of 8-bit levels ``0..255``; ``sign``
    (``+-1`` per image) orients the geometric operations; ``fill`` (in ``[0, 1]``) is what the
    geometric operations leave outside the image. Returns levels ``0..255``. See the module
    docstring for the magnitude scales (the authors' reference code)."""
    if name not in _OP_ID:
        raise ValueError(f"unknown AutoAugment operation {name!r}; choose one of {list(OPERATIONS)}")
    n, c, h, w = v.shape
    lv = torch.as_tensor(level, device=v.device).to(torch.float64).expand(n)
    sg = torch.as_tensor(sign, device=v.device).to(torch.float64).expand(n)
    fill_t = torch.as_tensor(fill, dtype=v.dtype, device=v.device).flatten() * 255.0
    if fill_t.numel() not in (1, c):
        raise ValueError(f"fill has {fill_t.numel()} values for images with {c} channels")
    fill_t = torch.round(fill_t.expand(c))
    zero, one = torch.zeros_like(lv), torch.ones_like(lv)
    if name in ("ShearX", "ShearY"):
        s = sg * lv * 0.3 / _PARAMETER_MAX
        coeffs = [one, s, zero, zero, one, zero] if name == "ShearX" else [one, zero, zero, s, one, zero]
        return _affine_nearest(v, torch.stack(coeffs, 1), fill_t)
    if name in ("TranslateX", "TranslateY"):
        side = w if name == "TranslateX" else h
        pixels = sg * torch.floor(lv * (10.0 * side / 32.0) / _PARAMETER_MAX)
        if name == "TranslateX":
            coeffs = [one, zero, pixels, zero, one, zero]
        else:
            coeffs = [one, zero, zero, zero, one, pixels]
        return _affine_nearest(v, torch.stack(coeffs, 1), fill_t)
    if name == "Rotate":
        degrees = sg * torch.floor(lv * 30.0 / _PARAMETER_MAX)
        return _affine_nearest(v, _rotate_coeffs(degrees, h, w), fill_t)
    if name == "AutoContrast":
        return _autocontrast(v)
    if name == "Invert":
        return 255.0 - v
    if name == "Equalize":
        return _equalize(v)
    if name == "Solarize":
        threshold = (256.0 - torch.floor(lv * 256.0 / _PARAMETER_MAX)).to(v.dtype).view(n, 1, 1, 1)
        return torch.where(v >= threshold, 255.0 - v, v)
    if name == "Posterize":
        bits = 4.0 - torch.floor(lv * 4.0 / _PARAMETER_MAX)
        q = torch.pow(2.0, 8.0 - bits).to(v.dtype).view(n, 1, 1, 1)
        return torch.floor(v / q) * q
    factor = (lv * 1.8 / _PARAMETER_MAX + 0.1).to(v.dtype)
    if name == "Brightness":
        return _blend(torch.zeros_like(v), v, factor)
    if name == "Color":
        return _blend(_grey(v).expand_as(v), v, factor)
    if name == "Contrast":
        mean = torch.floor(_grey(v).mean(dim=(1, 2, 3), keepdim=True) + 0.5)
        return _blend(mean.expand_as(v), v, factor)
    return _blend(_smooth(v), v, factor)  # Sharpness


# --------------------------------------------------------------------------- the policy
def _policy_tables(policy: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if policy not in POLICIES:
        raise ValueError(f"unknown AutoAugment policy {policy!r}; choose one of {sorted(POLICIES)}")
    table = POLICIES[policy]
    ops = torch.tensor([[_OP_ID[name] for name, _, _ in sub] for sub in table])
    probs = torch.tensor([[p for _, p, _ in sub] for sub in table], dtype=torch.float64)
    levels = torch.tensor([[0 if lv is None else lv for _, _, lv in sub] for sub in table])
    return ops, probs, levels


def _check_unit_images(x: torch.Tensor, what: str) -> None:
    if not isinstance(x, torch.Tensor) or x.ndim != 4 or not x.is_floating_point():
        got = type(x).__name__
        if isinstance(x, torch.Tensor):
            got = f"{x.dtype} tensor of shape {tuple(x.shape)}"
        raise ValueError(f"{what}: expected a floating tensor of images [N, C, H, W] in [0, 1], got {got}")


def autoaugment(
    x: torch.Tensor,
    policy: str = "cifar10",
    *,
    generator: torch.Generator | None = None,
    fill: float | Sequence[float] = 0.0,
    subsets: bool | None = None,
) -> torch.Tensor:
    """AutoAugment policy ``policy`` (a key of :data:`POLICIES`) on every image of ``x``
    (``[N, C, H, W]``, values in ``[0, 1]``): per image a sub-policy uniformly at random, then its
    first and its second operation, each with its probability (Cubuk et al. 2019, Sec. 3); the
    sub-policy, the coin flips and the signs of the geometric operations come from ``generator``.
    Works on the 8-bit levels ``round(255 x)`` (module docstring) and returns them divided by 255,
    in ``x``'s dtype and device. ``subsets``: transform only the images that drew an operation
    (default on the CPU) or the whole batch and select (default elsewhere); the results agree."""
    _check_unit_images(x, "autoaugment")
    ops, probs, levels = _policy_tables(policy)
    n = x.shape[0]
    draw = generator.device if generator is not None else torch.device("cpu")
    sub = torch.randint(0, ops.shape[0], (n,), generator=generator, device=draw).cpu()
    coins = torch.rand(n, 2, generator=generator, device=draw, dtype=torch.float64).cpu()
    signs = torch.rand(n, 2, generator=generator, device=draw).cpu()
    # the per-image parameters are small [N, 2] tables, moved to x's device once
    op_of = ops[sub].to(x.device)
    apply = (coins < probs[sub]).to(x.device)
    level_of = levels[sub].to(x.device)
    sign_of = torch.where(signs > 0.5, -1.0, 1.0).to(torch.float64).to(x.device)
    v = torch.round(x.clamp(0.0, 1.0) * 255.0)
    # module docstring: subsets on the host, the whole batch elsewhere
    gather = x.device.type == "cpu" if subsets is None else bool(subsets)
    for slot in range(2):
        for op_id in sorted(set(ops[:, slot].tolist())):  # the policy's operations: no device read
            mask = apply[:, slot] & (op_of[:, slot] == op_id)
            name, lv, sg = OPERATIONS[op_id], level_of[:, slot], sign_of[:, slot]
            if gather:
                idx = mask.nonzero().squeeze(1)
                if idx.numel():
                    v[idx] = apply_operation(v[idx], name, lv[idx], sg[idx], fill=fill)
            else:
                out = apply_operation(v, name, lv, sg, fill=fill)
                v = torch.where(mask.view(n, 1, 1, 1), out, v)
    return v / 255.0


class AutoAugment:
    """Per-batch AutoAugment with its own seeded generator: ``aug = AutoAugment("cifar10", seed=0)``,
    then ``aug(x)`` for every batch. With ``mean`` / ``std`` the batch is standardised (``(u - mean)
    / std`` per channel, e.g. :data:`landscape.data.common.CHANNEL_STATS`): it is un-standardised to
    ``[0, 1]`` before the policy and standardised again after it; ``fill`` is in ``[0, 1]``."""

    def __init__(
        self,
        policy: str = "cifar10",
        *,
        seed: int = 0,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        fill: float | Sequence[float] = 0.0,
    ):
        _policy_tables(policy)
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {seed!r}")
        if (mean is None) != (std is None):
            raise ValueError("AutoAugment: give both mean and std (standardised inputs) or neither")
        if std is not None and any(float(s) <= 0 for s in std):
            raise ValueError(f"AutoAugment: standard deviations must be positive, got {list(std)}")
        self.policy, self.seed = policy, seed
        self.mean = None if mean is None else tuple(float(m) for m in mean)
        self.std = None if std is None else tuple(float(s) for s in std)
        self.fill = fill if isinstance(fill, (int, float)) else tuple(float(f) for f in fill)
        self.generator = torch.Generator().manual_seed(seed)

    @property
    def config(self) -> dict[str, Any]:
        return {"transform": "autoaugment", "policy": self.policy, "seed": self.seed}

    def state(self) -> torch.Tensor:
        return self.generator.get_state()

    def load_state(self, state: torch.Tensor) -> None:
        self.generator.set_state(state)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.mean is None:
            return autoaugment(x, self.policy, generator=self.generator, fill=self.fill)
        return standardised_autoaugment(
            x, self.policy, self.mean, self.std, generator=self.generator, fill=self.fill
        )

    def __repr__(self) -> str:
        return f"AutoAugment(policy={self.policy!r}, seed={self.seed})"


def standardised_autoaugment(
    x: torch.Tensor,
    policy: str,
    mean: Sequence[float],
    std: Sequence[float],
    *,
    generator: torch.Generator | None = None,
    fill: float | Sequence[float] = 0.0,
) -> torch.Tensor:
    """:func:`autoaugment` on standardised images ``x = (u - mean) / std``: ``u`` is recovered,
    augmented in ``[0, 1]`` and standardised again."""
    _check_unit_images(x, "standardised_autoaugment")
    m = torch.as_tensor(list(mean), dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    s = torch.as_tensor(list(std), dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    if m.numel() != x.shape[1] or s.numel() != x.shape[1]:
        raise ValueError(f"{m.numel()} means and {s.numel()} stds for images with {x.shape[1]} channels")
    u = autoaugment(x * s + m, policy, generator=generator, fill=fill)
    return (u - m) / s
