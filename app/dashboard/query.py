"""Page settings in the URL: ``?problem=himmelblau&optimizers=GD,SAM`` presets a page's sidebar, so a
view can be shared as a link (and the pages write their current selection back into the address bar).

Each page asks :class:`QueryPresets` for the parameters it understands, with the options and the
default of the widget they preset; the answer becomes the widget's initial value. A value the page
cannot use never stops the page: it falls back to the default and :meth:`QueryPresets.show` prints a
warning that names the parameter, the value and the accepted values. Matching ignores case and
punctuation (``lenet5`` selects ``LeNet-5``); lists are comma-separated or repeated
(``optimizers=GD&optimizers=SAM``); ``all`` selects every option of a list.

The parsing is plain Python over a ``{name: [values]}`` dict (tests call it without Streamlit);
:meth:`QueryPresets.from_page` reads ``st.query_params``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["ALL", "PRESETS", "QueryPresets", "norm", "preset_url"]

#: the value that selects every option of a list parameter
ALL = "all"

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


#: the example links on the home page: (page file under app/, label, URL parameters); each page reads
#: these parameters (tests open every link and check that no parameter falls back to its default)
PRESETS: list[tuple[str, str, dict[str, str]]] = [
    ("pages/1_Optimizer_playground.py", "Optimizer playground: Himmelblau, all optimizers",
     {"problem": "himmelblau", "optimizers": "all"}),
    ("pages/2_Smoothed_objectives.py", "Smoothed objectives: Rosenbrock at ρ = 2",
     {"problem": "rosenbrock", "rho": "2"}),
    ("pages/4_Network_landscape.py", "Network landscape: all optimizers, 2 epochs",
     {"optimizers": "all", "epochs": "2"}),
    ("pages/6_Curvature_monitor.py", "Curvature monitor: edge of stability",
     {"preset": "edge_of_stability"}),
    ("pages/8_Flatness_study.py", "Flatness study: against the test error", {"target": "test_error"}),
]  # fmt: skip


def preset_url(page: str, params: Mapping[str, str]) -> str:
    """The relative URL of a page file with parameters: ``pages/2_Smoothed_objectives.py`` and
    ``{"rho": "2"}`` give ``Smoothed_objectives?rho=2`` (commas kept readable)."""
    from urllib.parse import urlencode

    name = re.sub(r"^\d+_", "", page.rsplit("/", 1)[-1].removesuffix(".py"))
    return name + ("?" + urlencode(dict(params), safe=",") if params else "")


def norm(value: Any) -> str:
    """The matching key of a value: lower case, letters and digits only (``"LeNet-5"`` -> ``"lenet5"``)."""
    return re.sub(r"[^0-9a-z]", "", str(value).lower())


def _listed(values: Sequence[Any], label: Callable[[Any], str] = str) -> str:
    return ", ".join(label(v) for v in values)


class QueryPresets:
    """The URL parameters of one page: typed look-ups with a fallback and a warning for bad values.

    ``params`` maps a parameter name to its values (``st.query_params.get_all(name)``)."""

    def __init__(self, params: Mapping[str, Sequence[str]]) -> None:
        self.params = {str(k): [str(v) for v in vs] for k, vs in params.items()}
        self.asked: list[str] = []
        self.warnings: list[str] = []

    @classmethod
    def from_page(cls) -> QueryPresets:
        """The current page's ``st.query_params``."""
        import streamlit as st

        return cls({k: st.query_params.get_all(k) for k in st.query_params})

    # ------------------------------------------------------------------ look-ups
    def _raw(self, name: str) -> list[str] | None:
        self.asked.append(name)
        values = self.params.get(name)
        if values is None:
            return None
        return [part.strip() for v in values for part in v.split(",") if part.strip()]

    def _bad(self, name: str, value: str, accepted: str, fallback: str) -> None:
        self.warnings.append(
            f"URL parameter {name}={value!r} is not valid: {accepted}. Showing {fallback} instead."
        )

    def choice(
        self,
        name: str,
        options: Sequence[Any],
        default: Any,
        *,
        label: Callable[[Any], str] = str,
        hints: Mapping[str, str] | None = None,
    ) -> Any:
        """One of ``options`` (matched by :func:`norm`), else ``default``; ``hints`` adds a sentence
        for known values the page does not offer (e.g. where else to find them)."""
        raw = self._raw(name)
        if raw is None:
            return default
        by_key = {norm(o): o for o in options}
        if len(raw) == 1 and norm(raw[0]) in by_key:
            return by_key[norm(raw[0])]
        value = ",".join(raw)
        accepted = f"choose one of {_listed(options, label)}"
        hint = {norm(k): v for k, v in (hints or {}).items()}.get(norm(value))
        self._bad(name, value, f"{hint}; {accepted}" if hint else accepted, label(default))
        return default

    def choices(
        self, name: str, options: Sequence[Any], default: Sequence[Any], *, label: Callable[[Any], str] = str
    ) -> list[Any]:
        """A list of ``options`` in the order given (``all``: every option), else ``default``.
        Unknown entries are dropped with a warning; if none is left, ``default`` is used."""
        raw = self._raw(name)
        if raw is None:
            return list(default)
        by_key = {norm(o): o for o in options}
        if not raw:  # "name=": an empty selection
            return []
        if [norm(v) for v in raw] == [ALL]:
            return list(options)
        chosen = [by_key[norm(v)] for v in raw if norm(v) in by_key]
        chosen = list(dict.fromkeys(chosen))  # without repeats
        unknown = [v for v in raw if norm(v) not in by_key]
        if unknown:
            fallback = _listed(chosen, label) if chosen else _listed(default, label)
            accepted = f"choose from {_listed(options, label)} (comma-separated) or {ALL}"
            self._bad(name, ",".join(unknown), accepted, fallback)
        return chosen or list(default)

    def number(
        self,
        name: str,
        default: float,
        *,
        low: float | None = None,
        high: float | None = None,
        options: Sequence[float] | None = None,
        integer: bool = False,
        step: float | None = None,
    ) -> Any:
        """A number in ``[low, high]`` (on the grid ``low + k step`` if ``step``; one of ``options``;
        an ``int`` if ``integer``), else ``default``."""
        raw = self._raw(name)
        if raw is None:
            return default
        value = ",".join(raw)
        if options is not None:
            accepted = f"choose one of {_listed(options)}"
        elif integer:
            accepted = f"give a whole number from {low:g} to {high:g}"
        else:
            accepted = f"give a number from {low:g} to {high:g}"
            accepted += f" in steps of {step:g}" if step else ""
        try:
            x = float(value)
        except ValueError:
            x = math.nan
        ok = math.isfinite(x) and (not integer or x == int(x))
        if ok and options is not None:
            match = [o for o in options if math.isclose(float(o), x, rel_tol=1e-12, abs_tol=1e-12)]
            ok = bool(match)
            x = match[0] if ok else x
        elif ok:
            ok = (low is None or x >= low) and (high is None or x <= high)
            if ok and step:
                k = (x - (low or 0.0)) / step
                ok = math.isclose(k, round(k), abs_tol=1e-9)
        if not ok:
            self._bad(name, value, accepted, f"{default:g}")
            return default
        if integer:
            return int(x)
        return x if options is not None else float(x)

    def flag(self, name: str, default: bool) -> bool:
        """``1/true/yes/on`` or ``0/false/no/off``, else ``default``."""
        raw = self._raw(name)
        if raw is None:
            return default
        value = ",".join(raw).lower()
        if value in _TRUE or value in _FALSE:
            return value in _TRUE
        self._bad(name, value, "give 1 or 0 (true/false)", "1" if default else "0")
        return default

    # ------------------------------------------------------------------ reporting
    def unknown(self) -> list[str]:
        """Warnings for parameters the page never asked about."""
        extra = [k for k in self.params if k not in self.asked]
        if not extra:
            return []
        return [
            f"URL parameter(s) {', '.join(extra)} not used on this page; it reads {', '.join(self.asked)}."
        ]

    def messages(self) -> list[str]:
        return self.warnings + self.unknown()

    def show(self) -> None:
        """Each warning as ``st.warning`` (the page goes on with the fallbacks)."""
        import streamlit as st

        for message in self.messages():
            st.warning(message)

    @staticmethod
    def encode_choices(chosen: Sequence[Any], options: Sequence[Any]) -> str:
        """``all`` when ``chosen`` is every option in order, else the comma-separated list."""
        return ALL if list(chosen) == list(options) else ",".join(str(c) for c in chosen)

    @staticmethod
    def encode(value: Any) -> str:
        """A value as it is written into the URL (lists comma-separated, numbers in ``%g``)."""
        if isinstance(value, bool):
            return "1" if value else "0"
        if isinstance(value, float):
            return f"{value:g}"
        if isinstance(value, (list, tuple)):
            return ",".join(str(v) for v in value)
        return str(value)

    def write_back(self, **values: Any) -> None:
        """Put the page's current selection into the address bar (``st.query_params``), so that the
        URL reproduces the view. Parameters the page does not read are left out."""
        import streamlit as st

        wanted = {k: self.encode(v) for k, v in values.items()}
        current = {k: ",".join(st.query_params.get_all(k)) for k in st.query_params}
        if current != wanted:
            st.query_params.from_dict(wanted)
