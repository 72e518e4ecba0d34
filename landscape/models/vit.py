"""Vision Transformers (Dosovitskiy et al. 2021, "An image is worth 16x16 words", ICLR): ViT-B/16,
the backbone Fisher-SAM fine-tunes in Table 3, and DeiT-B (Touvron et al. 2021, "Training
data-efficient image transformers & distillation through attention", ICML), its Table 2 network.

The image (``image_size`` square, 224) is cut into ``patch_size`` patches (16: 196 tokens),
embedded linearly (a stride-``patch_size`` convolution), a learned class token is prepended and
learned position embeddings added (Eq. 1); ``depth`` pre-norm encoder blocks
``x + MSA(LN(x))``, ``x + MLP(LN(x))`` (Eqs. 2-3; MLP ``dim -> 4 dim -> dim`` with GELU, multi-head
self-attention with a fused biased QKV projection and an output projection, computed by
``torch.nn.functional.scaled_dot_product_attention``); a final LayerNorm and a linear head on the
class token (Eq. 4). LayerNorm eps 1e-6 as in the reference code.

* ``vit-b16``: dim 768, depth 12, 12 heads, MLP 3072: **86,567,656** parameters for 1000
  classes (torchvision's ``vit_b_16`` count). The head is a single linear layer, as in fine-tuning
  (the paper's ImageNet-21k pre-training adds a pre-logits layer that is dropped for fine-tuning).
* ``deit-b``: the same body (DeiT-B is ViT-B/16 trained with the DeiT recipe;
  facebookresearch/deit ``deit_base_patch16_224``, 86.6M). Fisher-SAM's Table 2 starts from 81.94%
  top-1, the non-distilled DeiT-B's accuracy (the distilled one reaches 83.4%), so no distillation
  token. It differs from ``vit-b16`` only in initialisation: timm/DeiT's
  ``trunc_normal_(std=0.02)`` weights for every linear layer (cut at +-2, so effectively normal),
  where ``vit-b16`` follows torchvision (Xavier-uniform QKV and MLP weights, a ``N(0, 1/fan_in)``
  patch embedding, zero head). Position embeddings are ``N(0, 0.02^2)`` in both.

``dropout`` acts after the embeddings, after the attention projection and after both MLP layers
(the ViT paper's dropout placement; 0 for fine-tuning, as both papers). Inputs must be
``image_size`` square: the position embeddings are not interpolated (fine-tune CIFAR at 224 by
resizing the images, as the ViT paper does).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from landscape.models.layers import check_dropout

INITS = ("torchvision", "deit")


class SelfAttention(nn.Module):
    """Multi-head self-attention: fused QKV projection, scaled dot-product attention, projection."""

    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v)  # softmax(q k^T / sqrt(d_head)) v
        return self.drop(self.proj(out.transpose(1, 2).reshape(b, n, d)))


class EncoderBlock(nn.Module):
    """Pre-norm transformer block (Dosovitskiy et al. 2021, Eqs. 2-3)."""

    def __init__(self, dim: int, heads: int, mlp_dim: int, dropout: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = SelfAttention(dim, heads, dropout)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(
            nn.Linear(dim, mlp_dim),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(mlp_dim, dim),
            nn.Dropout(dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class VisionTransformer(nn.Module):
    """ViT with a class token; see the module docstring.

    Args:
        image_size, patch_size: square input side and patch side (``image_size % patch_size == 0``).
        dim, depth, heads, mlp_dim: width, number of blocks, attention heads, MLP hidden width.
        init: ``"torchvision"`` or ``"deit"`` (module docstring).
    """

    def __init__(
        self,
        image_size: int = 224,
        patch_size: int = 16,
        num_classes: int = 1000,
        in_channels: int = 3,
        *,
        dim: int = 768,
        depth: int = 12,
        heads: int = 12,
        mlp_dim: int = 3072,
        dropout: float = 0.0,
        init: str = "torchvision",
    ):
        super().__init__()
        if patch_size < 1 or image_size < patch_size or image_size % patch_size:
            raise ValueError(
                f"image_size must be a positive multiple of patch_size, got {image_size} and {patch_size}"
            )
        if dim % heads:
            raise ValueError(f"dim must be divisible by heads, got dim={dim}, heads={heads}")
        if init not in INITS:
            raise ValueError(f"init must be one of {INITS}, got {init!r}")
        check_dropout(dropout)
        self.image_size, self.patch_size = image_size, patch_size
        tokens = (image_size // patch_size) ** 2 + 1
        self.patch_embed = nn.Conv2d(in_channels, dim, patch_size, stride=patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.empty(1, tokens, dim))
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.Sequential(*(EncoderBlock(dim, heads, mlp_dim, dropout) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, num_classes)
        self._init(init)

    def _init(self, scheme: str) -> None:
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        if scheme == "deit":  # timm / facebookresearch/deit
            nn.init.trunc_normal_(self.cls_token, std=0.02)
            for m in self.modules():
                if isinstance(m, nn.Linear):
                    nn.init.trunc_normal_(m.weight, std=0.02)
                    nn.init.zeros_(m.bias)
            return
        # torchvision's VisionTransformer: patch embedding N(0, 1 / fan_in), Xavier-uniform QKV and
        # MLP weights (MLP biases N(0, 1e-6^2)), zero attention biases, a zero head
        fan_in = self.patch_embed.in_channels * self.patch_size**2
        nn.init.trunc_normal_(self.patch_embed.weight, std=math.sqrt(1.0 / fan_in))
        nn.init.zeros_(self.patch_embed.bias)
        for block in self.blocks:
            nn.init.xavier_uniform_(block.attn.qkv.weight)  # nn.MultiheadAttention's in_proj
            nn.init.zeros_(block.attn.qkv.bias)
            nn.init.zeros_(block.attn.proj.bias)  # out_proj: default weight, zero bias
            for lin in (block.mlp[0], block.mlp[3]):
                nn.init.xavier_uniform_(lin.weight)
                # N(0, 1e-6^2) (trunc_normal_: normal_ on the meta device costs seconds of imports)
                nn.init.trunc_normal_(lin.bias, std=1e-6)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 4 or x.shape[-2:] != (self.image_size, self.image_size):
            raise ValueError(
                f"VisionTransformer(image_size={self.image_size}) expects [N, C, {self.image_size}, "
                f"{self.image_size}] images, got shape {tuple(x.shape)}; resize the inputs"
            )
        tokens = self.patch_embed(x).flatten(2).transpose(1, 2)  # [N, patches, dim]
        tokens = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), tokens], dim=1)
        out = self.norm(self.blocks(self.drop(tokens + self.pos_embed)))
        return self.head(out[:, 0])


def vit_b16(num_classes: int = 1000, in_channels: int = 3, *, image_size: int = 224,
            dropout: float = 0.0) -> VisionTransformer:  # fmt: skip
    """ViT-B/16 (Dosovitskiy et al. 2021, Table 1: ViT-Base, patch 16)."""
    return VisionTransformer(image_size, 16, num_classes, in_channels, dropout=dropout, init="torchvision")


def deit_b(num_classes: int = 1000, in_channels: int = 3, *, image_size: int = 224,
           dropout: float = 0.0) -> VisionTransformer:  # fmt: skip
    """DeiT-B (Touvron et al. 2021, Table 1: DeiT-B, patch 16, 224, no distillation token)."""
    return VisionTransformer(image_size, 16, num_classes, in_channels, dropout=dropout, init="deit")
