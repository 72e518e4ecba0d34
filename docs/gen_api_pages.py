"""Regenerate ``docs/api/*.md``: one ``:::`` block per public module, grouped by package.

    python docs/gen_api_pages.py

``tests/test_repo.py`` checks that every public module is covered, so run this after adding one.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("landscape", "optimizers", "toy_problems", "experiments")
PAGES = {
    "landscape": ("`landscape`: objective, guard, results, files, metrics", "landscape", 1),
    "curvature": ("`landscape.curvature`", "landscape.curvature", None),
    "sharpness": ("`landscape.sharpness`", "landscape.sharpness", None),
    "surface": ("`landscape.surface`", "landscape.surface", None),
    "data_models": ("`landscape.data` and `landscape.models`", ("landscape.data", "landscape.models"), None),
    "optimizers": ("`optimizers`", "optimizers", None),
    "toy_problems": ("`toy_problems`", "toy_problems", None),
    "experiments": ("`experiments`", "experiments", None),
}


def public_modules() -> list[str]:
    out = []
    for pkg in PACKAGES:
        for p in sorted((ROOT / pkg).rglob("*.py")):
            rel = p.relative_to(ROOT)
            if p.name == "__main__.py" or any(s.startswith("_") and s != "__init__.py" for s in rel.parts):
                continue
            parts = list(rel.with_suffix("").parts)
            out.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return sorted(out)


def main() -> None:
    mods = public_modules()
    packages = {m for m in mods if any(x.startswith(m + ".") for x in mods)}
    subpackages = {m for m in packages if m.count(".") == 1 and m.startswith("landscape.")}
    for page, (title, prefix, depth) in PAGES.items():
        prefixes = prefix if isinstance(prefix, tuple) else (prefix,)
        sel = [m for m in mods if any(m == p or m.startswith(p + ".") for p in prefixes)]
        if depth is not None:  # the top-level page: modules not in a subpackage of their own
            sel = [m for m in sel if not any(m == s or m.startswith(s + ".") for s in subpackages)]
        blocks = [f"# {title}\n"]
        for m in sel:
            opts = "    options:\n      members: false\n" if m in packages else ""
            blocks.append(f"::: {m}\n{opts}")
        (ROOT / "docs" / "api" / f"{page}.md").write_text("\n".join(blocks))


if __name__ == "__main__":
    main()
