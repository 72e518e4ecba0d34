"""experiments: the seed papers' tables from one TOML config file.

::

    python -m experiments run configs/digits_sam_vs_sgd.toml train.epochs=3 budget=0.5
    python -m experiments table runs/digits_sam_vs_sgd --format markdown --plot runs/digits.png

* :mod:`experiments.config`: TOML configs, dotted overrides, defaults, checks and ``budget``;
* :mod:`experiments.runner`: the grid of runs (sweep variants x methods x seeds) and the files of
  each run; :mod:`experiments.run_identity`: which run a configuration is (its result-relevant
  settings and fingerprint); :mod:`experiments.train`: one run (checkpointed every epoch,
  resumable bit-exactly);
* :mod:`experiments.methods`: optimizers by name; :mod:`experiments.closures`: the closure each
  optimizer needs (mean loss, per-example losses for VOGN, the NLL for F-SGVB);
  :mod:`experiments.members`: deep ensembles (member runs, resumable one by one);
  :mod:`experiments.amp`: mixed precision; :mod:`experiments.parallel`: ``torchrun`` (grid split or
  data parallel); :mod:`experiments.sync_batchnorm`: BatchNorm over the global batch (gloo too);
* :mod:`experiments.data`: data sets (``landscape.data``), subsets, label noise, OOD sets;
  :mod:`experiments.evaluate`: metrics, Bayesian model averages, CIFAR-10-C, sharpness;
* :mod:`experiments.table`: mean ± std over seeds, next to the papers' numbers, and a figure.

This package builds on ``landscape`` and ``optimizers``; neither imports it.
"""

from experiments.config import ConfigError, load_config
from experiments.runner import RunResult, plan_runs, run_one
from experiments.table import aggregate, collect_runs, format_table

__all__ = [
    "ConfigError",
    "RunResult",
    "aggregate",
    "collect_runs",
    "format_table",
    "load_config",
    "plan_runs",
    "run_one",
]
