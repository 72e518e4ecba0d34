"""Where the dashboard and the example configs are, in a checkout and in an installed wheel.

In a checkout they are the repository's ``app/`` and ``configs/`` (next to this package). A wheel
ships them as the packages ``sharpscape_app`` and ``sharpscape_configs`` (``pyproject.toml`` maps
``app/`` and ``configs/`` to these names), installed next to this package in ``site-packages``. The
installed names are looked up first, so a stray ``app/`` directory elsewhere is never taken.

Configs are named by their path under ``configs/`` without ``.toml`` (``digits_sam_vs_sgd``,
``miniatures/label_noise``); :func:`resolve_config` turns such a name (or ``configs/NAME.toml``
typed outside the repository) into the installed file, so the README's commands work anywhere.
"""

from __future__ import annotations

from pathlib import Path

import tomllib

__all__ = [
    "APP_PACKAGE",
    "CONFIGS_PACKAGE",
    "RUN_KEYS",
    "STUDY_KEYS",
    "app_home",
    "commands",
    "config_kind",
    "configs_dir",
    "format_config_list",
    "list_configs",
    "resolve_config",
    "wrong_config",
]

#: the installed names of ``app/`` and ``configs/`` (see ``[tool.setuptools.package-dir]``)
APP_PACKAGE, CONFIGS_PACKAGE = "sharpscape_app", "sharpscape_configs"

_ROOT = Path(__file__).resolve().parent.parent  # site-packages, or the repository in a checkout


def _shipped(installed: str, checkout: str, marker: str) -> Path | None:
    for base in (_ROOT / installed, _ROOT / checkout):
        if (base / marker).is_file():
            return base
    return None


def app_home() -> Path:
    """The dashboard's main script (``app/Home.py``); :class:`FileNotFoundError` if not shipped."""
    base = _shipped(APP_PACKAGE, "app", "Home.py")
    if base is None:
        raise FileNotFoundError(
            f"the dashboard is not installed (neither {_ROOT / APP_PACKAGE} nor {_ROOT / 'app'} holds "
            "Home.py) — reinstall sharpscape: pip install 'sharpscape[app]'"
        )
    return base / "Home.py"


def configs_dir() -> Path | None:
    """The directory of the example configs (``configs/``), or ``None`` if they are not shipped."""
    return _shipped(CONFIGS_PACKAGE, "configs", "README.md")


def _description(path: Path, width: int = 80) -> str:
    """The start of a config's leading comment (its summary), at most ``width`` characters."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return ""
    words: list[str] = []
    for line in lines:
        if not line.startswith("#") or not line.lstrip("#").strip():
            break
        words += line.lstrip("#").split()
    text = " ".join(words)
    if len(text) <= width:
        return text
    return text[: width - 1].rsplit(" ", 1)[0] + " …"


#: top-level keys only a run config (``experiments.config.DEFAULTS``) has, and only a study config
#: (``experiments.study.config``) has; both also take ``name``, ``data``, ``device``, ``threads``.
#: Kept here, without importing those modules (they import torch; the dashboard and ``--help``
#: must not); tests/test_path_errors.py checks them against the two sets of defaults.
RUN_KEYS = frozenset(
    ("budget", "distributed", "evaluation", "extends", "methods", "model", "out_dir", "paper", "precision",
     "progress", "seeds", "sweep", "train")
)  # fmt: skip
STUDY_KEYS = frozenset(
    ("bases", "epochs", "measures", "n_models", "ood_noise", "optimizer_options", "populations",
     "runner", "sampling", "sampling_seed", "sharpness_dtype", "sharpness_subset", "space", "stop",
     "test_fraction")
)  # fmt: skip


def _top_keys(path: str | Path) -> set[str] | None:
    """The top-level keys of the TOML file ``path``; ``None`` if it is not one (the loader says why)."""
    try:
        return set(tomllib.loads(Path(path).read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None


def config_kind(path: str | Path) -> str | None:
    """``"run"`` (a config of ``experiments run``) or ``"study"`` (of ``experiments.study run``), by
    its top-level keys (:data:`RUN_KEYS`, :data:`STUDY_KEYS`); ``None`` for a file that is not a
    readable TOML table or holds keys of both kinds or of neither (its loader names the problem)."""
    keys = _top_keys(path) or set()
    run, study = bool(RUN_KEYS & keys), bool(STUDY_KEYS & keys)
    return "run" if run and not study else "study" if study and not run else None


def commands(prog: str) -> dict[str, str]:
    """The commands that run each kind of config, spelt as the user typed this program's name:
    ``sharpscape`` / ``sharpscape study`` -> ``sharpscape run``, ``sharpscape study run``;
    ``python -m experiments`` / ``python -m experiments.study`` -> ``python -m experiments run``,
    ``python -m experiments.study run``."""
    for tail in (" study", ".study"):
        if prog.endswith(tail):
            return {"run": f"{prog[: -len(tail)]} run", "study": f"{prog} run"}
    sub = ".study" if prog.endswith("experiments") else " study"
    return {"run": f"{prog} run", "study": f"{prog}{sub} run"}


def wrong_config(path: str | Path, expected: str, prog: str) -> tuple[str, str] | None:
    """``(what, fix)`` when ``path`` is a config of another kind than the command ``prog`` expects:
    ``expected`` is ``"run"``, ``"study"`` or ``"results"`` (a command that reads what a run wrote,
    ``table`` / ``study report``); the fix names the command that runs the config (spelt as
    ``prog``, see :func:`commands`); a run's ``metrics.json`` / ``results.json`` given as a config
    is named as such. ``None`` when ``path`` is no config of the other kind."""
    if expected != "results" and Path(path).name in ("metrics.json", "results.json"):
        return (
            f"{path} is the result file of a run, not a {expected} config",
            f"give a TOML config; the `table` command tabulates the runs in {Path(path).parent}",
        )
    kind = config_kind(path)
    if kind is None or kind == expected:
        return None
    command = commands(prog)[kind]
    usage = f"{command} {path} --out DIR" if kind == "study" else f"{command} {path}"
    marks = sorted((STUDY_KEYS if kind == "study" else RUN_KEYS) & (_top_keys(path) or set()))
    what = f"{path} is a {kind} config (it sets {', '.join(marks[:3])})"
    if expected == "results":
        where = "DIR" if kind == "study" else "its out_dir"
        return f"{what}, not a directory of results", f"run it with `{usage}`, then pass {where} here"
    return f"{what}, not a {expected} config", f"run it with `{usage}`"


def list_configs() -> list[tuple[str, Path, str, bool]]:
    """``(name, path, one-line description, is a study config)`` of every shipped config, by name."""
    base = configs_dir()
    if base is None:
        return []
    out = []
    for path in sorted(base.rglob("*.toml")):
        name = path.relative_to(base).with_suffix("").as_posix()
        out.append((name, path, _description(path), config_kind(path) == "study"))
    return out


def resolve_config(text: str) -> str:
    """``text`` if it names an existing file; else the shipped config it names (``NAME``,
    ``NAME.toml`` or ``configs/NAME.toml``) if there is one; else ``text`` unchanged (the caller
    reports the missing file)."""
    if Path(text).exists():
        return text
    base = configs_dir()
    if base is None:
        return text
    rel = text.replace("\\", "/")
    if rel.startswith("configs/"):
        rel = rel[len("configs/") :]
    if not rel or rel.startswith("/") or ".." in Path(rel).parts:
        return text
    for candidate in (base / rel, base / f"{rel}.toml"):
        if candidate.is_file() and candidate.suffix == ".toml":
            return str(candidate)
    return text


def format_config_list(prog: str) -> str:
    """The text of ``--list-configs``: one line per shipped config, then how to use a name with the
    commands of ``prog`` (``sharpscape``: ``sharpscape run``, ``sharpscape study run``)."""
    run, study = commands(prog)["run"], commands(prog)["study"]
    configs = list_configs()
    if not configs:
        return "no example configs are installed with this copy of sharpscape\n"
    width = max(len(c[0]) for c in configs)
    lines = [f"example configs in {configs_dir()} (give the name as CONFIG):"]
    lines += [f"  {n:<{width}}  {'[study] ' if st else ''}{desc}".rstrip() for n, _, desc, st in configs]
    runs = [c[0] for c in configs if not c[3]]
    studies = [c[0] for c in configs if c[3]]
    example = "digits_sam_vs_sgd" if "digits_sam_vs_sgd" in runs else (runs or ["NAME"])[0]
    lines.append(f"run one with `{run} {example}`")
    if studies:
        lines.append(f"[study] configs with `{study} {studies[0]} --out DIR`")
    lines.append("a path that exists is used as given: copy a file to edit it")
    return "\n".join(lines) + "\n"
