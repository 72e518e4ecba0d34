"""Does flatness predict generalisation? A population of models, their sharpness measures and the
rank correlation of each measure with the generalisation gap (Jiang et al. 2020).

::

    python -m experiments.study run configs/study_digits.toml --out runs/study_digits
    python -m experiments.study report runs/study_digits --figure docs/figures/study_digits.png

* :mod:`experiments.study.population`: the config, the sampled hyperparameter points, training
  and measuring one model, the resumable population;
* :mod:`experiments.study.correlation`: Kendall tau-b, bootstrap intervals, granulated tau;
* :mod:`experiments.study.report`: the per-model table, the correlation table and the figure.
"""

from experiments.study.correlation import bootstrap_tau, correlate, granulated_tau, kendall_tau_b
from experiments.study.population import (
    AXES,
    load_study_config,
    plan_population,
    resolve_study_config,
    run_population,
    train_and_measure,
)
from experiments.study.report import write_report

__all__ = [
    "AXES",
    "bootstrap_tau",
    "correlate",
    "granulated_tau",
    "kendall_tau_b",
    "load_study_config",
    "plan_population",
    "resolve_study_config",
    "run_population",
    "train_and_measure",
    "write_report",
]
