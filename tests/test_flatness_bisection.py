"""The bisection behind Jiang et al.'s flatness measures, on deviations with closed-form roots."""

import math

import pytest

from landscape.sharpness.flatness import _bisect


@pytest.mark.parametrize("start", [1.0, 100.0, 2.0**-20])
def test_bisection_brackets_from_either_side_and_converges_geometrically(start):
    # deviation s^2 <= 10: s* = sqrt(10); from a feasible start the bracket doubles, from an
    # infeasible one it halves; each geometric bisection halves log(hi / lo)
    s, hist = _bisect(lambda s: s * s, 10.0, 20, start)
    points = [p for p, _ in hist]
    assert all(d == p * p for p, d in hist) and s * s <= 10.0
    if start == 1.0:
        assert points[:3] == [1.0, 2.0, 4.0] and len(points) == 3 + 20  # lo = 2, hi = 4
    elif start == 100.0:
        assert points[:6] == [100.0, 50.0, 25.0, 12.5, 6.25, 3.125] and len(points) == 6 + 20
    else:  # 22 doublings from 2^-20: the last feasible is 2, the first infeasible 4
        assert points[:23] == [2.0 ** (k - 20) for k in range(23)] and len(points) == 23 + 20
    # every bracket spans a factor 2; the root lies in [s, s * 2^(1 / 2^steps)]
    assert 0.0 <= math.log(math.sqrt(10.0) / s) <= math.log(2.0) / 2**20 + 1e-15


def test_bisection_unbounded_and_empty_feasible_sets():
    s, hist = _bisect(lambda s: -1.0, 1.0, 5, 1.0, max_doublings=7)
    assert s == math.inf and [p for p, _ in hist] == [2.0**k for k in range(8)]
    s, hist = _bisect(lambda s: 5.0, 1.0, 5, 1.0, max_doublings=7)
    assert s == 0.0 and [p for p, _ in hist] == [2.0**-k for k in range(8)]
