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
