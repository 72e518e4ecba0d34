#!/usr/bin/env bash
# The GPU checks of issues 25 and 27 in one go, for a session that is lent a GPU machine (the
# device tool runs this in the repository root; results land in $OUT, default benchmarks/results).
#
#   bash benchmarks/gpu_checks.sh tests      # the gpu-marked tests (about 2 min)
#   bash benchmarks/gpu_checks.sh training   # bench_training.py on ResNet-20 and WRN-16-4
#   bash benchmarks/gpu_checks.sh products   # bench_products.py --device cuda (time, memory, spectra)
#   bash benchmarks/gpu_checks.sh surface    # bench_surface.py --device cuda (ResNet-20, ResNet-18)
#   bash benchmarks/gpu_checks.sh estimate   # --estimate of the paper configs on CIFAR-format files
#
# Each stage fits one device call (10 minutes); run them in that order and copy the JSON files from
# $OUT into benchmarks/results/ afterwards. Logs: $OUT/<stage>.log.
set -u -o pipefail
stage="${1:?give a stage: tests, training, products, surface or estimate}"
out="${OUT:-benchmarks/results}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
py="${PYTHON:-python3}"
case "$stage" in
  tests)
    $py -m pytest -q -m gpu tests 2>&1 | tee "$out/tests.log" ;;
  training)
    for model in resnet20 wrn16-4; do
      $py benchmarks/bench_training.py --device cuda --model "$model" --rounds 3 --steps 30 \
        --methods sgd,sam,sam-m8,asam,fsam,bsam,bsam-m8,ivon,swag,sgd-compiled,sam-compiled,bsam-compiled \
        --out "$out" 2>&1 | tee -a "$out/training.log"
    done ;;
  products)
    $py benchmarks/bench_products.py --device cuda --out "$out" 2>&1 | tee "$out/products.log" ;;
  surface)
    $py benchmarks/bench_surface.py --device cuda --out "$out" 2>&1 | tee "$out/surface.log" ;;
  estimate)
    data="${SHARPSCAPE_DATA:-/tmp/cifar10-like}"
    [ -f "$data/data_batch_1" ] || $py benchmarks/make_cifar_like.py "$data"
    for cfg in configs/*cifar10*.toml; do
      SHARPSCAPE_DATA="$data" $py -m experiments run "$cfg" --estimate device=cuda 2>&1 | tee -a "$out/estimate.log"
    done ;;
  *)
    echo "error: unknown stage '$stage'; give tests, training, products, surface or estimate" >&2
    exit 2 ;;
esac
