import json

from benchmarks import _runner


def test_ratios_table_and_json(tmp_path):
    rows = [
        {"method": "anchor", "case": "a", "seconds": 2.0},
        {"method": "ours", "case": "a", "seconds": 1.0},
        {"method": "anchor", "case": "b", "seconds": 4.0},
        {"method": "ours", "case": "b", "seconds": 6.0},
    ]
    _runner.add_ratios(rows, "seconds", lambda r: r["method"] == "anchor", group="case")
    assert [r["seconds_ratio"] for r in rows] == [1.0, 0.5, 1.0, 1.5]
    table = _runner.format_table(rows)
    assert "seconds_ratio" in table.splitlines()[0] and len(table.splitlines()) == 6
    path = _runner.report("unit", rows, config={"x": 1}, out_dir=tmp_path)
    data = json.loads(path.read_text())
    assert data["rows"][3]["seconds_ratio"] == 1.5 and data["machine"]["torch"]


def test_atomic_write_keeps_old_file_on_error_and_uses_normal_permissions(tmp_path):
    import os

    import pytest

    from landscape.io import atomic_write, atomic_write_text

    path = tmp_path / "r.json"
    atomic_write_text(path, "old")
    umask = os.umask(0)
    os.umask(umask)
    assert (path.stat().st_mode & 0o777) == (0o666 & ~umask)

    def failing(p):
        p.write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        atomic_write(path, failing)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary file left behind
