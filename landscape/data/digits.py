"""The 1,797 8x8 handwritten digits of scikit-learn (embedded, no files needed): the default data."""

from __future__ import annotations

import numpy as np
import torch

from landscape.data.common import Batch, check_dtype, check_split


def load_digits(
    split: str = "all",
    *,
    seed: int = 0,
    test_fraction: float = 0.2,
    dtype: torch.dtype = torch.float32,
    image: bool = False,
    standardize: bool = True,
) -> Batch:
    """The 1,797 8x8 handwritten digits of scikit-learn (UCI optdigits test set), standardised.

    Args:
        split: ``"train"``, ``"test"`` or ``"all"``. The train/test split is a seeded random
            permutation (``seed``) with ``round(test_fraction * 1797)`` test examples.
        test_fraction: share of the examples in the test split, in (0, 1).
        dtype: floating dtype of the inputs.
        image: ``False`` -> inputs ``[N, 64]``; ``True`` -> ``[N, 1, 8, 8]`` (for LeNet-5/ResNet).
        standardize: subtract the per-pixel mean and divide by the per-pixel standard deviation,
            both computed on the TRAIN split (constant pixels keep scale 1), so train and test use
            the same transform.

    Returns:
        ``(X, y)`` with ``y`` int64 labels in 0..9.
    """
    check_split(split)
    check_dtype(dtype)
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must lie in (0, 1), got {test_fraction}")
    from sklearn.datasets import load_digits as _sk_digits

    bunch = _sk_digits()
    x = np.asarray(bunch.data, dtype=np.float64)
    y = np.asarray(bunch.target, dtype=np.int64)
    n = len(y)
    perm = np.random.default_rng(seed).permutation(n)
    n_test = int(round(test_fraction * n))
    test_idx, train_idx = np.sort(perm[:n_test]), np.sort(perm[n_test:])
    if standardize:
        mean = x[train_idx].mean(axis=0)
        std = x[train_idx].std(axis=0)
        std[std == 0] = 1.0
        x = (x - mean) / std
    idx = {"train": train_idx, "test": test_idx, "all": np.arange(n)}[split]
    xs = torch.as_tensor(x[idx]).to(dtype)
    if image:
        xs = xs.reshape(-1, 1, 8, 8)
    return xs, torch.as_tensor(y[idx])
