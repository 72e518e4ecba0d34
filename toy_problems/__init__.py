"""toy_problems: the papers' 2-D problems and the figures they illustrate.

    import toy_problems as tp
    tp.names()                          # registered problems
    prob = tp.get("gaussian_mixture")   # Fisher SAM eq. 15
    prob.loss(theta)                    # theta [..., 2] -> [...]
    tp.run_trajectory(prob, lambda p: SAM(p, torch.optim.SGD, rho=1.0, lr=5.0), start, steps)

``python -m toy_problems figures --out DIR`` regenerates every figure (see ``toy_problems.figures``).
"""

from toy_problems.base import Minimum, ToyProblem, get, gradient, hessian, names, register  # noqa: F401
from toy_problems.classic import (  # noqa: F401
    Beale,
    Himmelblau,
    IllConditionedQuadratic,
    Rastrigin,
    Rosenbrock,
    Saddle,
)
from toy_problems.gaussian_mixture import PAPER_MINIMA, GaussianMixture  # noqa: F401
from toy_problems.logistic import (  # noqa: F401
    ExactPosterior,
    Gaussian,
    LogisticRegression,
    predictive_distances,
)
from toy_problems.smoothing import basins, gaussian_smoothed, sam_first_order, worst_case_ball  # noqa: F401
from toy_problems.trajectory import Trajectory, run_trajectory  # noqa: F401
from toy_problems.two_moons import TwoMoons, make_moons  # noqa: F401
