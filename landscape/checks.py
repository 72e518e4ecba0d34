"""Argument validators shared by the estimators, sharpness measures, surfaces and optimizers.

Every check raises one clear error that names the argument, shows the bad value and says what is
accepted.  A value of the wrong *type* raises :class:`ArgumentTypeError` (a ``TypeError`` that is
also a ``ValueError``, so callers catching either see it); a value of the right type outside the
accepted range raises ``ValueError``.  Booleans are never accepted as numbers (``True`` is an
``int`` in Python, but ``k=True`` is a mistake, not ``k=1``), and NaN never passes a range check:
every comparison is written so that NaN fails it (``not value > 0`` rather than ``value <= 0``).

Numbers may be Python ``int``/``float``, numpy scalars or 0-d real torch tensors (a tensor learning
rate is legal in ``torch.optim``); integers must be Python or numpy integers.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = [
    "ArgumentTypeError",
    "available_bytes",
    "check_bool",
    "check_budget",
    "check_choice",
    "check_finite",
    "check_int",
    "check_nonnegative",
    "check_number",
    "check_positive",
    "check_probability",
    "check_range",
    "check_seed",
    "format_bytes",
]

#: Largest seed ``torch.Generator.manual_seed`` accepts.
MAX_SEED = 2**64 - 1


class ArgumentTypeError(TypeError, ValueError):
    """An argument of the wrong type (a ``TypeError`` and a ``ValueError`` at once)."""


def _is_bool(value: Any) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return True
    return isinstance(value, torch.Tensor) and value.dtype == torch.bool


def _is_integer(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not _is_bool(value)


def _is_number(value: Any) -> bool:
    if _is_bool(value):
        return False
    if isinstance(value, (int, float, np.integer, np.floating)):
        return True
    return isinstance(value, torch.Tensor) and value.ndim == 0 and not value.is_complex()


def check_number(name: str, value: Any, *, integer: bool = False) -> float:
    """``value`` as a float; :class:`ArgumentTypeError` unless it is a (real, non-bool) number.

    ``integer=True`` accepts Python and numpy integers only (``3.0`` is refused: an index or a
    count given as a float is usually a mistake).
    """
    if integer:
        if not _is_integer(value):
            raise ArgumentTypeError(f"{name} must be an integer, got {type(value).__name__} ({value!r})")
        return float(value)
    if not _is_number(value):
        raise ArgumentTypeError(f"{name} must be a real number, got {type(value).__name__} ({value!r})")
    return float(value)


def check_bool(name: str, value: Any) -> bool:
    """``True`` or ``False`` (numpy's ``bool_`` too), returned as a ``bool``; anything else (``1``,
    ``"yes"``, ``None``) is an :class:`ArgumentTypeError`."""
    if not isinstance(value, (bool, np.bool_)):
        raise ArgumentTypeError(f"{name} must be True or False, got {type(value).__name__} ({value!r})")
    return bool(value)


def check_int(name: str, value: Any, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """An integer in ``[minimum, maximum]`` (either bound optional); returns it as an ``int``."""
    check_number(name, value, integer=True)
    v = int(value)
    if (minimum is not None and v < minimum) or (maximum is not None and v > maximum):
        lo = "-inf" if minimum is None else str(minimum)
        hi = "inf" if maximum is None else str(maximum)
        raise ValueError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")
    return v


def check_finite(name: str, value: Any) -> float:
    """A finite real number (not NaN, not +-inf); returns it as a float."""
    v = check_number(name, value)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return v


def check_positive(
    name: str, value: Any, *, integer: bool = False, allow_zero: bool = False, allow_inf: bool = False
) -> float:
    """A number ``> 0`` (``>= 0`` with ``allow_zero``), finite unless ``allow_inf``; NaN is refused."""
    v = check_number(name, value, integer=integer)
    ok = (v >= 0 if allow_zero else v > 0) and (allow_inf or math.isfinite(v))
    if not ok:  # NaN fails both comparisons
        bound = ">= 0" if allow_zero else "> 0"
        kind = "an integer" if integer else ("a number" if allow_inf else "a finite number")
        raise ValueError(f"{name} must be {kind} {bound}, got {value!r}")
    return v


def check_nonnegative(name: str, value: Any, *, integer: bool = False) -> float:
    """A finite number ``>= 0`` (shorthand for ``check_positive(..., allow_zero=True)``)."""
    return check_positive(name, value, integer=integer, allow_zero=True)


def check_range(
    name: str,
    value: Any,
    low: float,
    high: float,
    *,
    low_open: bool = False,
    high_open: bool = False,
    integer: bool = False,
) -> float:
    """A number in the interval from ``low`` to ``high`` (each end closed unless ``*_open``)."""
    v = check_number(name, value, integer=integer)
    above = v > low if low_open else v >= low
    below = v < high if high_open else v <= high
    if not (above and below):
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise ValueError(f"{name} must lie in {interval}, got {value!r}")
    return v


def check_probability(name: str, value: Any, *, allow_zero: bool = True, allow_one: bool = True) -> float:
    """A number in ``[0, 1]`` (ends excluded on request)."""
    return check_range(name, value, 0.0, 1.0, low_open=not allow_zero, high_open=not allow_one)


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> Any:
    """``value`` if it is one of ``choices``, else a ``ValueError`` listing them."""
    choices = tuple(choices)
    try:
        ok = value in choices
    except Exception:  # e.g. a tensor compared with strings
        ok = False
    if not ok or _is_bool(value) and not any(c is value for c in choices):
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")
    return value


def check_budget(name: str, value: Any, minimum: int, *, who: str, why: str, fix: str | None = None) -> int:
    """A count (products, samples, steps) of at least the ``minimum`` that ``who`` can use.

    The one rule for every estimator's budget: an integer (:class:`ArgumentTypeError` otherwise)
    and ``>= minimum``, else ``ValueError("{who} needs {name} >= {minimum} (got {value}): {why};
    {fix}")`` -- the problem, the value given, the smallest value that works and the fix (default
    ``pass {name} >= {minimum}``).  Returns the value as an ``int``.
    """
    check_number(name, value, integer=True)
    if int(value) < minimum:
        fix = fix if fix is not None else f"pass {name} >= {minimum}"
        raise ValueError(f"{who} needs {name} >= {minimum} (got {value!r}): {why}; {fix}")
    return int(value)


def check_seed(seed: Any, name: str = "seed", *, allow_generator: bool = True) -> None:
    """``None``, an integer in ``[0, 2**64 - 1]`` or (``allow_generator``) a ``torch.Generator``.

    Floats (``1.5`` and ``1.0`` alike), booleans and negative integers are refused: a float seed is
    almost always a mistake and a negative one would silently wrap around to a huge seed.
    """
    if seed is None or (allow_generator and isinstance(seed, torch.Generator)):
        return
    accepted = "None, an integer in [0, 2**64 - 1]" + (" or a torch.Generator" if allow_generator else "")
    if not _is_integer(seed):
        raise ArgumentTypeError(f"{name} must be {accepted}; got {type(seed).__name__} ({seed!r})")
    if not 0 <= int(seed) <= MAX_SEED:
        raise ValueError(f"{name} must be {accepted}; got {seed!r}")


# --------------------------------------------------------------------------------------------
# memory: checked before a large allocation, so that the error names the size and the fix
# --------------------------------------------------------------------------------------------
def available_bytes(device: torch.device | str) -> int | None:
    """Memory that can still be allocated on ``device`` (``None`` when it cannot be determined).

    CPU: ``MemAvailable`` of ``/proc/meminfo`` (else ``sysconf``), capped by a cgroup v2 limit;
    CUDA: the free memory reported by the driver.
    """
    device = torch.device(device)
    if device.type == "cuda":
        try:
            return int(torch.cuda.mem_get_info(device)[0])
        except Exception:  # no driver / not initialised: do not guess
            return None
    if device.type != "cpu":
        return None
    avail = None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
    except OSError:
        pass
    if avail is None:
        try:
            avail = int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError, AttributeError):
            return None
    try:  # a container's memory limit can be far below the machine's free memory
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
        if limit.isdigit():
            avail = min(avail, max(0, int(limit) - used))
    except (OSError, ValueError):
        pass
    return avail


def format_bytes(n: float) -> str:
    """``n`` bytes in GiB (from 0.25 GiB) or MiB."""
    return f"{n / 2**30:.3g} GiB" if n >= 2**28 else f"{n / 2**20:.3g} MiB"
