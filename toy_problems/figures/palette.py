"""One colour per method, used by every dashboard page and by the reproduced figures.

A method keeps its colour whatever else is selected (the colour is looked up by name, never by the
position in a selection), and no two methods share one. ``bSAM`` is the short name of
``BayesianSAM`` (Moellenhoff & Khan 2023), so both names give the same colour.
"""

from __future__ import annotations

__all__ = ["METHOD_COLORS", "ALIASES", "method_color"]

METHOD_COLORS: dict[str, str] = {
    # optimizers
    "GD": "#8c564b",  # brown
    "SGD": "#bcbd22",  # olive
    "Adam": "#17becf",  # cyan
    "SAM": "#d62728",  # red
    "ASAM": "#9467bd",  # purple
    "FisherSAM": "#2ca02c",  # green
    "RandomSAM": "#e377c2",  # pink
    "MixSAM": "#393b79",  # navy
    "BayesianSAM": "#1f77b4",  # blue
    "SGDTracer": "#637939",  # moss
    "MFVI": "#7b4173",  # plum
    # posteriors and reference points of the Bayesian view
    "SAM+Laplace": "#ff7f0e",  # orange
    "Laplace at MAP": "#c49c94",  # tan
    "MAP": "#7f7f7f",  # grey
    "exact": "#000000",  # black
}

#: other names of the same method
ALIASES: dict[str, str] = {"bSAM": "BayesianSAM", "FSAM": "FisherSAM"}


def method_color(name: str) -> str:
    """The colour of method ``name`` (a run label such as ``"SAM #2"`` takes its method's colour).

    Raises ``KeyError`` naming the known methods for a name that has none."""
    base = str(name).split(" #")[0].strip()
    base = ALIASES.get(base, base)
    if base not in METHOD_COLORS:
        raise KeyError(f"no colour for method {name!r}; known: {sorted(METHOD_COLORS) + sorted(ALIASES)}")
    return METHOD_COLORS[base]
