"""The Objective's state is its own: no module but ``landscape/objective.py`` touches its private
members (operators, optimizers, surfaces and Laplace use the public protocol of
``docs/OBJECTIVE_API.md``).

The private names are read from the AST of ``landscape/objective.py`` (methods and ``self._x``
attributes of ``class Objective``); every other project module is parsed and each attribute access
``<receiver>._name`` (or ``getattr``/``setattr``/``hasattr(<receiver>, "_name")``) is checked,
where the receiver looks like an objective: a name or attribute such as ``obj``, ``objective``,
``o``, ``sub_obj``, ``self.objective``, ``ctx.obj``, or ``self`` inside a subclass of an
``...Objective`` class.  Any *assignment* of a private attribute on such a receiver counts too,
whether or not objective.py defines the name (state set from outside), and so does any
``getattr``/``hasattr`` probe of a private name (``getattr(obj, "_data", None)`` silently reads the
default once the name is gone) and a subclass's ``def`` of one of the private methods (an
override of a private hook)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import torch
from torch import nn

from landscape.objective import Objective
from tests import references as ref

ROOT = Path(__file__).resolve().parents[1]
OBJECTIVE = ROOT / "landscape" / "objective.py"
PACKAGES = ("landscape", "optimizers", "experiments", "app", "toy_problems", "sharpscape", "benchmarks")
PACKAGES += ("tests",)  # white-box tests too: none needs the Objective's private members
RECEIVER = re.compile(r"^_*(\w+_)?(obj|objective|o)\d*(_\w+)?$")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def objective_private_names(source: str) -> set[str]:
    """Private methods, class attributes and ``self._x`` attributes of ``class Objective``."""
    names: set[str] = set()
    for cls in ast.walk(ast.parse(source)):
        if not (isinstance(cls, ast.ClassDef) and cls.name == "Objective"):
            continue
        for node in ast.walk(cls):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(node.name):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                if node.value.id == "self" and isinstance(node.ctx, ast.Store) and _private(node.attr):
                    names.add(node.attr)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node in cls.body:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names |= {t.id for t in targets if isinstance(t, ast.Name) and _private(t.id)}
    return names


def _objective_like(receiver: ast.expr, in_subclass: bool) -> bool:
    if isinstance(receiver, ast.Name):
        return bool(RECEIVER.match(receiver.id)) or (in_subclass and receiver.id == "self")
    if isinstance(receiver, ast.Attribute):
        return bool(RECEIVER.match(receiver.attr))
    return False


def private_uses(source: str, names: set[str]) -> list[tuple[int, str]]:
    """``(line, text)`` of every access to one of ``names``, every private assignment and every
    ``getattr``-family probe of a private name on an objective-like receiver in ``source``, and of
    every ``def`` of one of ``names`` in a subclass of an ``...Objective`` class."""
    tree = ast.parse(source)
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, in_subclass: bool) -> None:
        if isinstance(node, ast.ClassDef):
            bases = [ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases]
            in_subclass = any(b.endswith("Objective") for b in bases)
        if in_subclass and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in names:
            found.append((node.lineno, f"def {node.name}"))  # overrides a private method
        if isinstance(node, ast.Attribute) and _private(node.attr):
            store = isinstance(node.ctx, (ast.Store, ast.Del))
            if (node.attr in names or store) and _objective_like(node.value, in_subclass):
                found.append((node.lineno, ast.unparse(node)))
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _private(node.args[1].value)
            and _objective_like(node.args[0], in_subclass)
        ):
            found.append((node.lineno, ast.unparse(node)))
        for child in ast.iter_child_nodes(node):
            visit(child, in_subclass)

    visit(tree, False)
    return found


def _names() -> set[str]:
    return objective_private_names(OBJECTIVE.read_text())


def test_the_private_names_are_read_from_objective_py():
    names = _names()
    # a few that must be there (state, slots, the raw forward): the collection is not vacuous
    assert {"_data_issues", "_mutated", "_output_kind", "_pslots", "_forward"} <= names, names
    assert not any(n.startswith("__") for n in names)


def test_the_check_catches_private_uses():
    names = _names()
    snippet = """
def f(obj, op, ctx):
    issues = obj._data_issues
    op.objective._forward({}, {}, None)
    getattr(ctx.obj, "_mutated")
    cached = getattr(obj, "_gone", None)
    obj._anything_new = 1
    sub_obj = obj.subset("0")
    return sub_obj._output_kind, obj.model._modules, objective.num_examples

class Mine(ls.Objective):
    def g(self):
        return self._pslots

    def _weight(self, size):
        return 1.0

class Other:
    def g(self):
        return self._pslots
"""
    hits = [text for _, text in private_uses(snippet, names)]
    assert hits == [
        "obj._data_issues",
        "op.objective._forward",
        "getattr(ctx.obj, '_mutated')",
        "getattr(obj, '_gone', None)",
        "obj._anything_new",
        "sub_obj._output_kind",
        "self._pslots",
        "def _weight",
    ], hits


def test_no_module_uses_the_objectives_private_members():
    names = _names()
    bad = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")) if (ROOT / pkg).is_dir() else []:
            if path == OBJECTIVE:
                continue
            for line, text in private_uses(path.read_text(), names):
                bad.append(f"{path.relative_to(ROOT)}:{line}: {text}")
    assert not bad, "private members of the Objective used outside landscape/objective.py:\n" + "\n".join(bad)


def test_the_docs_name_no_private_member_of_the_objective():
    names = _names()
    alternatives = "|".join(map(re.escape, sorted(names)))
    pattern = re.compile(r"\b(?:obj|objective|Objective)\.(" + alternatives + r")\b")
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    bad = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in pages for m in pattern.finditer(p.read_text())]
    assert not bad, bad


# ------------------------------------------------------------------------------ the public hooks
def _problem():
    x, y = ref.make_classification_data(13)
    return ref.make_mlp((4, 6, 3)), nn.CrossEntropyLoss(), ref.split_batches(x, y, [5, 8])


def test_settings_and_like_rebuild_the_objective():
    model, ce, batches = _problem()
    obj = Objective(model, ce, batches, params=["0"], dtype=torch.float32)
    again = Objective(model, ce, batches, **obj.settings())
    assert again.config() == obj.config() and again.settings() == obj.settings()
    assert obj.local_num_examples == obj.num_examples == 13
    other = obj.like(batches[:1], None)
    assert type(other) is Objective and other.num_examples == 5 and other.num_params == 51
    assert other.dtype == torch.float32 and obj.subset("2").param_names == ["2.weight", "2.bias"]
    assert obj.with_data(batches[1:]).param_names == obj.param_names == ["0.weight", "0.bias"]


def test_all_reduce_is_the_hook_for_data_parallel_sums():
    """A subclass that overrides ``all_reduce`` (as DistributedObjective does) gets the global N from
    it at construction, and every whole-data reduction goes through it: two ranks holding the same
    data give the single-process values."""

    class TwoRanks(Objective):
        def all_reduce(self, t):
            return 2 * t

    model, ce, batches = _problem()
    plain, two = Objective(model, ce, batches), TwoRanks(model, ce, batches)
    assert (two.local_num_examples, two.num_examples) == (13, 26)
    assert torch.allclose(two.loss(), plain.loss(), rtol=1e-14, atol=0)
    assert torch.allclose(two.gradient(), plain.gradient(), rtol=1e-14, atol=0)
    assert two.evaluate() == plain.evaluate()
    assert type(two.subset("0")) is Objective  # like() builds a plain Objective unless overridden
