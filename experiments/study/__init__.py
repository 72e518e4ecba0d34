"""Does flatness predict generalisation? A population of models, their sharpness measures and the
rank correlation of each measure with the generalisation gap (Jiang et al. 2020).

::

    python -m experiments.study run configs/study_digits.toml --out runs/study_digits
    python -m experiments.study report runs/study_digits --figure docs/figures/study_digits.png

* :mod:`experiments.study.config`: the study config and the sampled hyperparameter points;
* :mod:`experiments.study.members`: each point as a run of the experiment runner
  (:mod:`experiments.runner`: resumable run directory, config, environment, logs, checkpoint);
* :mod:`experiments.study.stopping`: the common stopping criterion (train until the training
  cross-entropy reaches a target, Jiang et al. 2020), members that never get there are excluded;
* :mod:`experiments.study.measure`: errors, gaps and sharpness measures of a trained member;
* :mod:`experiments.study.population`: the resumable populations (reseeded samples; worker
  processes with ``jobs``);
* :mod:`experiments.study.correlation`: Kendall tau-b, bootstrap intervals, granulated tau;
* :mod:`experiments.study.combine`: per-population correlations and the pooled interval;
* :mod:`experiments.study.report`, :mod:`experiments.study.figure`,
  :mod:`experiments.study.summary`: the per-model table, the correlation tables, the figure and the
  findings in words.
"""

from experiments.study.combine import combine, population_correlations
from experiments.study.config import AXES, load_study_config, plan_population, resolve_study_config
from experiments.study.correlation import bootstrap_tau, correlate, granulated_tau, kendall_tau_b
from experiments.study.members import load_member, member_run, runner_config
from experiments.study.population import member_runs, population_ids, run_population, train_and_measure
from experiments.study.report import write_report

__all__ = [
    "AXES",
    "bootstrap_tau",
    "combine",
    "correlate",
    "granulated_tau",
    "kendall_tau_b",
    "load_member",
    "load_study_config",
    "member_run",
    "member_runs",
    "plan_population",
    "population_correlations",
    "population_ids",
    "resolve_study_config",
    "run_population",
    "runner_config",
    "train_and_measure",
    "write_report",
]
