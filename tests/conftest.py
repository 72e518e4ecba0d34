"""Shared pytest configuration: GPU tests skip without CUDA; float64 default for references."""

from __future__ import annotations

import os

import pytest
import torch

# Tests never read the user's data directory: loaders get explicit paths (tmp_path files).
os.environ.pop("SHARPSCAPE_DATA", None)

# Two cores on CI: keep torch from oversubscribing them when pytest-xdist is not used.
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA (no GPU on this machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def devices() -> list[str]:
    """Devices to run device-agnostic tests on: always CPU, plus CUDA when present."""
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
