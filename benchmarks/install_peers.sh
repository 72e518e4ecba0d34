#!/usr/bin/env bash
# The benchmark peers into the active environment without letting pip choose torch: the packages
# that depend on torch (or torchvision) go in with --no-deps, then their small pure-Python
# dependencies. Usage: source .venv/bin/activate && bash benchmarks/install_peers.sh
set -euo pipefail
python -c "import torch" 2>/dev/null || { echo "error: install torch first (pip install torch==2.13.0)" >&2; exit 1; }
# torchmetrics: the reference of the ECE cross-checks (tests/test_metrics_calibration.py).
pip install -q --no-deps \
  "curvlinops-for-pytorch==3.0.1" "backpack-for-pytorch==1.7.1" "einconv==0.1.0" "unfoldNd==0.2.3" \
  "linear_operator==0.6.1" "hessian-eigenthings==1.0.0a5" "PyHessian==0.1" "loss-landscapes==3.0.6" \
  "torchmetrics==1.9.0"
pip install -q "einops>=0.8" "opt_einsum>=3.3" "jaxtyping>=0.2" "lightning-utilities>=0.8" \
  typing_extensions packaging scipy tqdm
# laplace-torch: the reference of the KronLaplace cross-check (tests/test_kron_laplace_peer.py); it
# imports asdl (shipped by asdfghjkl 0.1a4, pure Python) and backpack at import time
pip install -q --no-deps "laplace-torch==0.3" "asdfghjkl==0.1a4"
# the trainers of docs/recipes.md (tests/test_recipes.py): Lightning and the HuggingFace Trainer,
# torch-based, so without their dependencies, which follow (none of them pulls torch)
pip install -q --no-deps "lightning==2.5.6" "transformers==4.57.6" "accelerate==1.15.0"
pip install -q fsspec pyyaml "huggingface-hub>=0.34,<1.0" "tokenizers>=0.22,<=0.23.0" "safetensors>=0.4" regex \
  psutil requests filelock
python -c "import curvlinops, laplace, hessian_eigenthings, pyhessian, torchmetrics, lightning, transformers, accelerate; print('benchmark peers and recipe trainers installed')"
