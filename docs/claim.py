"""One quoted result of the README and ``docs/`` (:class:`Claim`): the record the claim lists
(``docs/claim_list.py``, ``docs/claim_list_products.py``) write and the registry script
(``docs/claims.py``) reads. A leaf: the lists and the script import it, it imports neither.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Extract = Callable[[Any], float] | str


#: ATen's AVX2 kernels (``Claim.rerun_env`` of a result written with them and sensitive to them)
ATEN_AVX2 = {"ATEN_CPU_CAPABILITY": "avx2"}


@dataclass(frozen=True)
class Claim:
    """One quoted result (see ``docs/claims.py``'s docstring).

    ``values``: name -> a dotted path into the JSON (``runs.SAM.end.0``) or a function of the
    loaded JSON; ``quote``: the quoting text with ``{name:format}`` fields (whitespace is matched
    loosely, negative numbers are written with the typographic minus ``−``); ``rerun``: the command
    that writes ``source`` under ``{out}`` (``None``: a measurement, not re-run; ``a && b`` runs
    both, each must exit with a status in ``ok_status``); ``tolerance``: absolute difference allowed
    per value on a re-run.
    """

    id: str
    source: str
    values: dict[str, Extract]
    quote: str
    files: tuple[str, ...]
    inputs: tuple[str, ...]
    rerun: str | None = None
    tolerance: float = 0.0
    cost: str = "expensive"
    notes: str = ""
    minus: str = "−"
    ok_status: tuple[int, ...] = (0,)
    #: variables the re-run sets on top of ``claims.RERUN_ENV``: the CPU code path the committed JSON
    #: was written with, where the result is sensitive to it (``{"ATEN_CPU_CAPABILITY": "avx2"}``)
    rerun_env: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
