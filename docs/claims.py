"""The claims registry: every result the README and ``docs/`` quote, from the file a script wrote.

A claim (:class:`Claim`, listed in ``docs/claim_list.py``) names the JSON a command wrote, how its
values are read from it, the sentence that quotes them (a template), the files that quote it, the
command that regenerates the JSON, the files whose content defines the result (hashed), a tolerance
for re-runs and whether a re-run is cheap (default test suite) or expensive (``-m slow``).
``docs/claims.json`` is the machine-readable registry this script writes::

    python docs/claims.py update             # re-run the claims whose inputs changed, re-read all
    python docs/claims.py update --no-rerun  # only re-read the committed JSON files
    python docs/claims.py check              # quotes vs sources vs registry (what the tests check)
    python docs/claims.py rerun [--expensive] [--only ID]   # re-run into a temp dir, compare
    python docs/claims.py rewrite [--only ID]  # write the JSON's numbers into stale quotes

Every number of every page (``PAGES`` in ``docs/claim_list.py``: the README, the configs' README,
``docs/``) is accounted for: a page in ``NOT_RESULTS`` quotes no number outside a claim's quote but
in the phrases listed for it (a setting, a target, a version, a paper's own number; numbers in code,
link targets and section / equation / table / figure references never count, nor those of a line
copied whole from a generated page, such as a table row), and a page in ``GENERATED`` is compared
with its script's output by a test.

``tests/test_claims.py`` checks that every quote, filled from the current JSON, appears in its files
(a number edited by hand fails), that the registry matches the sources and the hashes of the inputs
(code changed without regenerating fails), and re-runs the cheap claims (the expensive ones under
``-m slow``) within their tolerance. Measured timings (benchmarks) are ``rerun=None``: their quote
is checked against their JSON, not re-measured.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from claim import Claim

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = ROOT / "docs" / "claims.json"


# ---------------------------------------------------------------------------------- reading
def lookup(data: Any, path: str) -> Any:
    """``a.b.0.c`` into nested dicts/lists; a part ``key=value`` picks the list item with that field."""
    node = data
    for part in path.split("."):
        if isinstance(node, list) and "=" in part:
            key, want = part.split("=", 1)
            node = next(item for item in node if str(item.get(key)) == want)
        elif isinstance(node, list):
            node = node[int(part)]
        else:
            node = node[part]
    return node


def read_values(claim: Claim, source: Path | None = None) -> dict[str, float]:
    data = json.loads((source or ROOT / claim.source).read_text())
    out = {}
    for name, how in claim.values.items():
        value = lookup(data, how) if isinstance(how, str) else how(data)
        out[name] = float(value)
    return out


def fill(claim: Claim, values: dict[str, float]) -> str:
    """The quote with its values formatted (typographic minus for negative numbers)."""

    def field_value(match: re.Match) -> str:
        name, spec = match.group(1), match.group(2) or ""
        text = format(values[name], spec)
        return text.replace("-", claim.minus) if text.startswith("-") else text

    return re.sub(r"\{(\w+)(?::([^}]*))?\}", field_value, claim.quote)


def normalise(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def file_hash(path: str) -> str:
    return hashlib.sha256((ROOT / path).read_bytes()).hexdigest()[:16]


# ---------------------------------------------------------------------------------- checks
def quote_problems(claim: Claim, values: dict[str, float]) -> list[str]:
    """Files that do not contain the claim's filled quote."""
    want = normalise(fill(claim, values))
    return [f for f in claim.files if want not in normalise((ROOT / f).read_text())]


NUMBER = r"[−+-]?(?:\d[\d,]*)?\.?\d+(?:[eE][−+-]?\d+)?"


def rewrite_quotes(claim: Claim, values: dict[str, float]) -> list[str]:
    """Write the JSON's numbers into each file whose quote of ``claim`` is stale.

    The quote template becomes a pattern (literal text, whitespace loose, a number for each field);
    where it matches exactly once, only the numbers are replaced (the file's line breaks stay).
    Returns the files rewritten; raises when a stale quote is not found exactly once."""
    parts = re.split(r"(\{\w+(?::[^}]*)?\})", claim.quote)
    pattern = "".join(
        f"({NUMBER})" if i % 2 else r"\s+".join(re.escape(w) for w in re.split(r"\s+", part))
        for i, part in enumerate(parts)
    )
    fields = parts[1::2]
    written = []
    for rel in quote_problems(claim, values):
        text = (ROOT / rel).read_text()
        found = list(re.finditer(pattern, text))
        if len(found) != 1:
            raise ValueError(f"{claim.id}: {len(found)} places in {rel} match the quote's text; edit by hand")
        match, new = found[0], text
        for k in range(len(fields), 0, -1):  # from the end, so that earlier spans stay valid
            number = fill(replace(claim, quote=fields[k - 1]), values)
            new = new[: match.start(k)] + number + new[match.end(k) :]
        tmp = (ROOT / rel).with_name(f".{Path(rel).name}.tmp")  # atomic: a page is never half-written
        tmp.write_text(new)
        tmp.replace(ROOT / rel)
        written.append(rel)
    return written


def entry(claim: Claim, values: dict[str, float]) -> dict[str, Any]:
    """The claim's registry record (without the provenance fields of :func:`provenance`)."""
    return {
        "id": claim.id,
        "values": values,
        "quote": fill(claim, values),
        "files": list(claim.files),
        "source": claim.source,
        "command": claim.rerun.format(out=str(Path(claim.source).parent)) if claim.rerun else None,
        "kind": "measurement" if claim.rerun is None else "re-runnable",
        "tolerance": claim.tolerance,
        "cost": claim.cost,
        "inputs": {path: file_hash(path) for path in claim.inputs},
        "environment": source_environment(claim),
        "notes": claim.notes,
    }


def source_environment(claim: Claim) -> Any:
    """The machine / environment record of the claim's JSON, where the script wrote one."""
    data = json.loads((ROOT / claim.source).read_text())
    if isinstance(data, dict):
        for key in ("machine", "environment", "env"):
            if key in data:
                return data[key]
    return None


def provenance() -> dict[str, Any]:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    import torch

    return {
        "commit_before_update": commit,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
    }


def registry_problems(claims: list[Claim]) -> list[str]:
    """Differences between the committed registry and the sources / inputs / claim list."""
    if not REGISTRY.exists():
        return [f"{REGISTRY.relative_to(ROOT)} is missing: run python docs/claims.py update"]
    committed = {e["id"]: e for e in json.loads(REGISTRY.read_text())["claims"]}
    problems = []
    for claim in claims:
        now = entry(claim, read_values(claim))
        old = committed.pop(claim.id, None)
        if old is None:
            problems.append(f"{claim.id}: not in the registry (python docs/claims.py update)")
            continue
        changed = [p for p, h in now["inputs"].items() if old["inputs"].get(p) != h]
        if changed:
            problems.append(
                f"{claim.id}: its inputs changed ({', '.join(changed)}) since it was generated: "
                "re-run it (python docs/claims.py update) and commit the new numbers"
            )
        for key in ("values", "quote", "files", "source", "command", "tolerance", "cost", "environment"):
            if now[key] != old[key]:
                problems.append(f"{claim.id}: {key} differs from the registry (python docs/claims.py update)")
    problems += [f"{cid}: in the registry but no longer a claim" for cid in committed]
    envs: dict[str, dict[str, str]] = {}
    for claim in claims:  # one command writes one JSON, in one environment
        if claim.rerun and envs.setdefault(claim.rerun, claim.rerun_env) != claim.rerun_env:
            problems.append(f"{claim.id}: rerun_env differs from that of the other claims of {claim.rerun!r}")
    return problems


#: a number as the pages write it: a decimal (a sentence's full stop may follow), a power of ten
#: (``2e-13``, ``3\cdot 10^{-4}``), or any number followed by ×, x or %
PAGE_NUMBER = re.compile(
    r"(?<![\w.\-/^{])(?:\d[\d,]*\.\d+(?:e[−+-]?\d+)?|\d+e[−+-]?\d+)(?:\s?\\cdot\s?10\^\{?[−+-]?\d+\}?)?"
    r"(?!\w|\.\d)(?:\s?[×%]|x\b)?"
    r"|(?<![\w.\-/^{])\d[\d,]*(?:\s?\\cdot\s?10\^\{?[−+-]?\d+\}?|\s?[×%]|x\b)"
)
#: numbers that are never results: code, link targets, and the numbers of sections, equations,
#: tables, figures, appendices, algorithms and versions
NOT_A_RESULT = re.compile(
    r"```.*?```|`[^`\n]*`|\]\([^)\s]*\)|<[^>\n]*>"
    r"|(?:Sec(?:tion|s)?\.?|[Ee]qs?\.|Eq(?:uation)?s?|Tables?|Tab\.|Figs?\.|Figures?|App(?:endix)?\.?|Alg(?:orithm)?\.?"
    r"|Thm\.|Theorem|Lemma|Prop(?:osition)?\.?|Corollary|Remark|Def(?:inition)?\.?|versions?|v)\s?\(?[A-Z]?\d+(?:\.\d+)+"
    r"|\b\d+\.\d+\.\d+\b",
    re.S,
)


def phrase_spans(text: str, phrase: str) -> list[tuple[int, int]]:
    """Where ``phrase`` occurs in ``text``, whitespace matched loosely (line breaks included)."""
    pattern = r"\s+".join(re.escape(w) for w in phrase.split())
    return [(m.start(), m.end()) for m in re.finditer(pattern, text)]


def copied_lines(text: str, sources: tuple[str, ...]) -> list[tuple[int, int]]:
    """The spans of the lines of ``text`` that are, whitespace aside, a whole line of one of the
    ``sources`` pages (generated pages, each compared with its script's output by a test): a table
    row copied from a generated page quotes that page's numbers."""
    lines = {
        normalise(line) for src in sources for line in (ROOT / src).read_text(encoding="utf-8").splitlines()
    }
    lines.discard("")
    spans, start = [], 0
    for line in text.splitlines(keepends=True):
        if normalise(line) in lines:
            spans.append((start, start + len(line)))
        start += len(line)
    return spans


def unclaimed_numbers(
    page: str, claims: list[Claim], phrases: tuple[str, ...], copied_from: tuple[str, ...] = ()
) -> list[str]:
    """The numbers of ``page`` that no claim quotes, no exempt phrase holds and no line copied whole
    from a page of ``copied_from`` (the generated pages) holds, as ``line: number: context``; and an
    exempt phrase the page no longer contains (a stale exemption)."""
    text = (ROOT / page).read_text(encoding="utf-8")
    covered = [(m.start(), m.end()) for m in NOT_A_RESULT.finditer(text)]
    covered += copied_lines(text, tuple(p for p in copied_from if p != page))
    for claim in claims:
        if page in claim.files:
            covered += phrase_spans(text, fill(claim, read_values(claim)))
    problems = []
    for phrase in phrases:
        spans = phrase_spans(text, phrase)
        if not spans:
            problems.append(f"{page}: the exempt phrase {phrase!r} is not on the page (remove it)")
        covered += spans
    for m in PAGE_NUMBER.finditer(text):
        if not any(a <= m.start() < b for a, b in covered):
            line = text.count("\n", 0, m.start()) + 1
            context = normalise(text[max(0, m.start() - 50) : m.end() + 20])
            problems.append(f"{page}:{line}: {m.group()!r} is neither a claim nor exempt ... {context} ...")
    return problems


def pages(patterns: tuple[str, ...]) -> list[str]:
    return sorted({str(p.relative_to(ROOT)) for pattern in patterns for p in ROOT.glob(pattern)})


def page_problems(claims: list[Claim], lists: Any) -> list[str]:
    """Every page of ``lists.PAGES`` is checked (``lists.NOT_RESULTS``: each of its numbers a claim's,
    in an exempt phrase or in a line copied whole from a ``lists.GENERATED`` page) or generated
    (``lists.GENERATED``: compared with its script by a test); a page with numbers in neither is a
    problem."""
    problems, generated = [], tuple(lists.GENERATED)
    for page in pages(lists.PAGES):
        if page in lists.NOT_RESULTS:
            problems += unclaimed_numbers(page, claims, lists.NOT_RESULTS[page], generated)
        elif page not in lists.GENERATED:
            numbers = unclaimed_numbers(page, claims, (), generated)
            if numbers:
                problems.append(
                    f"{page}: quotes {len(numbers)} numbers but is in neither NOT_RESULTS nor GENERATED "
                    f"(docs/claim_list.py); the first: {numbers[0]}"
                )
    listed = [*lists.NOT_RESULTS, *lists.GENERATED]
    known = pages(lists.PAGES)
    problems += [f"{p}: listed in docs/claim_list.py but not a page" for p in listed if p not in known]
    twice = {p for p in listed if listed.count(p) > 1}
    problems += [f"{p}: listed twice in docs/claim_list.py (checked or generated: one)" for p in twice]
    return problems


#: the environment of every re-run: MKL's conditional numerical reproducibility mode, so that its
#: matrix products give the same bits on every x86 CPU (the committed JSON files were written on
#: AMD machines, where MKL takes that path anyway, or with it set; on an AVX-512 Intel CPU MKL
#: otherwise takes another, and a sensitive run ends elsewhere: ASAM's path in Fisher-SAM's Fig. 3
#: by 1.3 in y, VSAM without its entropy term at loss 1.36 instead of about 0.73). A claim adds
#: what else its JSON was written with (``Claim.rerun_env``: ATen's AVX2 kernels where a result is
#: sensitive to them). Regenerate a JSON by hand with the same variables set
#: (``MKL_CBWR=COMPATIBLE python ...``).
RERUN_ENV = {"MKL_CBWR": "COMPATIBLE"}


def rerun(claim: Claim, out_dir: Path) -> dict[str, float]:
    """Run the claim's command writing into ``out_dir`` (in :data:`RERUN_ENV` and the claim's
    ``rerun_env``); the values it produced."""
    assert claim.rerun is not None
    env = {**os.environ, **RERUN_ENV, **claim.rerun_env}
    for step in claim.rerun.format(out=str(out_dir)).split(" && "):
        cmd = [sys.executable if a == "python" else a for a in shlex.split(step)]
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
        if done.returncode not in claim.ok_status:
            raise RuntimeError(f"{claim.id}: {step!r} failed ({done.returncode}): {done.stderr[-2000:]}")
    return read_values(claim, out_dir / Path(claim.source).name)


def rerun_problems(claim: Claim, values: dict[str, float], fresh: dict[str, float]) -> list[str]:
    bad = []
    for name, old in values.items():
        new = fresh[name]
        if not (math.isclose(new, old, rel_tol=0.0, abs_tol=claim.tolerance) or (new != new and old != old)):
            bad.append(
                f"{claim.id}.{name}: re-run gave {new!r}, committed {old!r} (tolerance {claim.tolerance})"
            )
    return bad


# ---------------------------------------------------------------------------------- command line
def _lists() -> Any:
    sys.path.insert(0, str(ROOT / "docs"))
    import claim_list

    return claim_list


def _claims() -> list[Claim]:
    return _lists().CLAIMS


def update(claims: list[Claim], do_rerun: bool) -> Path:
    old = {}
    if REGISTRY.exists():
        old = {e["id"]: e for e in json.loads(REGISTRY.read_text())["claims"]}
    for claim in claims:
        prev = old.get(claim.id)
        stale = prev is None or any(prev["inputs"].get(p) != file_hash(p) for p in claim.inputs)
        if do_rerun and stale and claim.rerun:
            print(f"re-running {claim.id}: {claim.rerun.format(out=Path(claim.source).parent)}", flush=True)
            rerun(claim, ROOT / Path(claim.source).parent)
    payload = {"provenance": provenance(), "claims": [entry(c, read_values(c)) for c in claims]}
    tmp = REGISTRY.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n")
    tmp.replace(REGISTRY)
    return REGISTRY


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python docs/claims.py", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("update")
    up.add_argument("--no-rerun", action="store_true")
    sub.add_parser("check")
    rr = sub.add_parser("rerun")
    rr.add_argument("--expensive", action="store_true")
    rr.add_argument("--only", default=None)
    rw = sub.add_parser("rewrite", help="write the JSON's numbers into the quotes that differ")
    rw.add_argument("--only", default=None)
    args = ap.parse_args(argv)
    claims = _claims()
    if args.cmd == "rewrite":
        for claim in claims:
            if args.only is None or claim.id == args.only:
                for rel in rewrite_quotes(claim, read_values(claim)):
                    print(f"{claim.id}: rewrote its quote in {rel}")
        return 0
    if args.cmd == "update":
        print(f"wrote {update(claims, not args.no_rerun)}")
        return 0
    if args.cmd == "check":
        problems = [
            f"{c.id}: quote not found in {f}" for c in claims for f in quote_problems(c, read_values(c))
        ]
        problems += registry_problems(claims)
        problems += page_problems(claims, _lists())
        done = f"{len(claims)} claims: quotes match their sources; checked pages quote only claims"
        print("\n".join(problems) or done)
        return 1 if problems else 0
    problems = []
    for claim in claims:
        if claim.rerun is None or (args.only and claim.id != args.only):
            continue
        if claim.cost == "expensive" and not args.expensive and not args.only:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            problems += rerun_problems(claim, read_values(claim), rerun(claim, Path(tmp)))
        print(f"{claim.id}: re-run done", flush=True)
    print("\n".join(problems) or "all re-run claims within tolerance")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
