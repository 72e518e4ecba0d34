"""Claims of ``docs/miniatures.md`` (its tables come from ``docs/figures/miniature_tables.md``).

And on those pages the phrases whose numbers are no result of ours (``NOT_RESULTS``).
See ``docs/claims.py`` for what a claim is and how the pages' numbers are checked.
"""

from __future__ import annotations

from claim import Claim

CLAIMS: list[Claim] = []

#: page -> the phrases on it whose numbers are no result of ours (a setting, a target, a paper's own
#: number); a page listed here has every other number quoted by a claim (tests/test_claims.py)
NOT_RESULTS: dict[str, tuple[str, ...]] = {}
