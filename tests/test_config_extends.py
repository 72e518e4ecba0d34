"""``extends``: a config derived from another (one table's block from another's protocol)."""

from __future__ import annotations

import pytest

from experiments.config import ConfigError, load_config


def _write(path, text):
    path.write_text(text)
    return path


def test_a_derived_config_merges_tables_and_replaces_lists(tmp_path):
    _write(
        tmp_path / "base.toml",
        'name = "base"\nseeds = [0, 1, 2]\n[train]\nepochs = 7\nlr = 0.3\nbatch_size = 32\n'
        '[[methods]]\nname = "sgd"\noptimizer = "sgd"\n[[methods]]\nname = "sam"\noptimizer = "sam"\n'
        'hyperparameters = { rho = 0.05 }\n[paper]\nsource = "base table"\n[paper.accuracy]\nsgd = 90.0\n',
    )
    (tmp_path / "sub").mkdir()
    child = _write(
        tmp_path / "sub" / "child.toml",
        'extends = "../base.toml"\nseeds = [5]\n[train]\nepochs = 2\n'
        '[[methods]]\nname = "sam"\noptimizer = "sam"\nhyperparameters = { rho = 0.1 }\n',
    )
    cfg = load_config(child, ["train.lr=0.2"])
    assert cfg["name"] == "child"  # never inherited
    assert cfg["seeds"] == [5]
    assert (cfg["train"]["epochs"], cfg["train"]["lr"], cfg["train"]["batch_size"]) == (2, 0.2, 32)
    assert [m["name"] for m in cfg["methods"]] == ["sam"]
    assert cfg["methods"][0]["hyperparameters"] == {"rho": 0.1}
    assert cfg["paper"] == {}  # a derived config carries its own paper numbers


def test_extends_chains_and_refuses_cycles_and_missing_files(tmp_path):
    sgd = '[[methods]]\nname = "sgd"\noptimizer = "sgd"\n'
    _write(tmp_path / "a.toml", "[train]\nepochs = 3\nlr = 0.5\n" + sgd)
    _write(tmp_path / "b.toml", 'extends = "a.toml"\n[train]\nepochs = 4\n')
    c = _write(tmp_path / "c.toml", 'extends = "b.toml"\n[train]\nbatch_size = 16\n')
    cfg = load_config(c)
    assert (cfg["train"]["epochs"], cfg["train"]["lr"], cfg["train"]["batch_size"]) == (4, 0.5, 16)
    _write(tmp_path / "x.toml", 'extends = "y.toml"\n')
    _write(tmp_path / "y.toml", 'extends = "x.toml"\n')
    with pytest.raises(ConfigError, match="cycle"):
        load_config(tmp_path / "x.toml")
    with pytest.raises(ConfigError, match="not a file"):
        load_config(_write(tmp_path / "m.toml", 'extends = "missing.toml"\n'))
    with pytest.raises(ConfigError, match="must name a config file"):
        load_config(_write(tmp_path / "n.toml", "extends = 3\n"))
