"""Untrusted result files: surface ``.npz``/JSON files and result JSON files written in their real
formats, then damaged in one specific way each; every case checks the error type and a message
fragment. NaN/inf round-trip as floats."""

from __future__ import annotations

import json
import math
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from landscape.curvature.eigen import EigenResult
from landscape.curvature.trace import DiagonalResult, TraceResult
from landscape.io import atomic_write_json
from landscape.results import Result, load_result
from landscape.sharpness.api import SharpnessResult
from landscape.surface.result import Surface, load_surface


def make_surface(nan: bool = False) -> Surface:
    rng = np.random.default_rng(3)
    xs, ys = np.linspace(-1.0, 1.0, 5), np.linspace(-0.5, 0.5, 4)
    loss = rng.random((5, 4)) + 1.0
    mask = np.ones((5, 4), dtype=bool)
    if nan:
        mask[3:, :] = False
        loss[~mask] = np.nan
        loss[0, 0] = np.inf  # a diverged point that was evaluated
    g = torch.Generator().manual_seed(3)
    dirs = [
        {"w": torch.randn(3, 2, dtype=torch.float64, generator=g), "b": torch.randn(2, generator=g)}
        for _ in "xy"
    ]
    values = {"loss": loss, "accuracy": rng.random((5, 4))}
    config = {"bn_policy": "eval", "radius": math.inf, "p": "inf"}
    return Surface(config, 1.5, [xs, ys], values, mask, dirs, evaluations=int(mask.sum()), strategy="loop")


# ------------------------------------------------------------------------------ NaN / inf round trip


def test_nan_and_inf_round_trip_as_floats(tmp_path):
    r = TraceResult(
        value=math.nan,
        stderr=math.inf,
        samples=[1.5, -math.inf, math.nan],
        config={"x": -math.inf, "p": "inf", "nested": [math.nan]},
        method="hutchinson",
    )
    r.save(tmp_path / "t.json")
    text = (tmp_path / "t.json").read_text()
    assert '"value": NaN' in text and '"stderr": Infinity' in text and '"nan"' not in text
    back = load_result(tmp_path / "t.json")
    assert type(back) is TraceResult and type(back.value) is float and math.isnan(back.value)
    assert back.stderr == math.inf and back.samples[:2] == [1.5, -math.inf] and math.isnan(back.samples[2])
    assert (
        back.config["x"] == -math.inf and back.config["p"] == "inf" and math.isnan(back.config["nested"][0])
    )
    d = DiagonalResult(values=torch.tensor([1.0, math.nan, -math.inf], dtype=torch.float64))
    d.save(tmp_path / "d.json")
    dv = load_result(tmp_path / "d.json").values
    assert dv.dtype == torch.float64 and dv[0] == 1.0 and torch.isnan(dv[1]) and dv[2] == -math.inf
    # files from older versions wrote non-finite scalars as strings: read back as floats
    legacy = {"type": "TraceResult", "value": "nan", "stderr": "inf", "exact_part": "-inf", "method": "inf"}
    (tmp_path / "old.json").write_text(json.dumps(legacy))
    old = load_result(tmp_path / "old.json")
    assert math.isnan(old.value) and old.stderr == math.inf and old.exact_part == -math.inf
    assert old.method == "inf"  # a str field keeps its string


def test_surface_round_trip_with_nan_inf_and_json_form(tmp_path):
    s = make_surface(nan=True)
    t = load_surface(s.save(tmp_path / "s.npz"))
    np.testing.assert_array_equal(t.loss, s.loss)  # NaN where the mask is False, inf at [0, 0]
    assert t.loss[0, 0] == math.inf and np.isnan(t.loss[3:]).all() and not t.complete
    assert t.config["radius"] == math.inf and t.config["p"] == "inf"
    pairs = [(a[k], b[k]) for a, b in zip(t.directions, s.directions) for k in b]
    assert len(pairs) == 4 and all(torch.equal(u, v) and u.dtype == v.dtype for u, v in pairs)
    atomic_write_json(tmp_path / "s.json", s.to_dict())
    for u in (load_surface(tmp_path / "s.json"), load_result(tmp_path / "s.json")):
        assert isinstance(u, Surface) and u.mask.dtype == bool
        np.testing.assert_array_equal(u.loss, s.loss)
        np.testing.assert_array_equal(u.mask, s.mask)
        assert torch.equal(u.directions[1]["w"], s.directions[1]["w"])


# ------------------------------------------------------------------------------ corrupt surfaces


def _flip(raw: bytes, at: int) -> bytes:
    return raw[:at] + bytes(b ^ 0xFF for b in raw[at : at + 32]) + raw[at + 32 :]


_RAW_DAMAGE = {
    "truncated": lambda raw: raw[: len(raw) // 2],
    "flipped_bytes": lambda raw: _flip(raw, len(raw) // 2),
    "not_npz": lambda raw: b"loss,accuracy\n1,2\n",
    "empty": lambda raw: b"",
}
# case -> edit of (arrays, meta) of a valid file; meta is written back unless the edit replaced it
_ARRAY_EDITS = {
    "no_meta": lambda a, m: a.pop("meta"),
    "meta_not_json": lambda a, m: a.update(meta=np.array('{"format": "landscape.Surface", ')),
    "object_array": lambda a, m: a.update(mask=np.array([{"a": 1}], dtype=object)),
    "newer_version": lambda a, m: m.update(format_version=99),
    "values_shape": lambda a, m: a.update(value_loss=a["value_loss"][:, :3]),
    "mask_missing": lambda a, m: a.pop("mask"),
    "mask_shape": lambda a, m: a.update(mask=a["mask"].T),
    "mask_float": lambda a, m: a.update(mask=a["mask"] * 2.5),
    "mask_int": lambda a, m: a.update(mask=a["mask"].astype(np.int64) * 2),
    "unknown_metric": lambda a, m: (
        a.update(value_error=a.pop("value_accuracy")),
        m.update(metrics=["loss", "error"]),
    ),
    "unlisted_values": lambda a, m: m.update(metrics=["loss"]),
    "coords_nan": lambda a, m: a.update(coords_1=np.array([0.0, np.nan, 1.0, 2.0])),
    "three_directions": lambda a, m: (
        m["direction_names"].append(["w"]),
        a.update(direction_2_0=np.zeros(2)),
    ),
}


def _damage_surface(path: Path, case: str) -> None:
    if case in _RAW_DAMAGE:
        path.write_bytes(_RAW_DAMAGE[case](path.read_bytes()))
        return
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    meta_entry = arrays["meta"]
    meta = json.loads(str(meta_entry))
    _ARRAY_EDITS[case](arrays, meta)
    if arrays.get("meta") is meta_entry:
        arrays["meta"] = np.array(json.dumps(meta))
    with open(path, "wb") as fh:
        (np.savez if case == "object_array" else np.savez_compressed)(fh, **arrays)


SURFACE_BAD = {
    "truncated": "corrupt or truncated .npz surface file",
    "flipped_bytes": r"corrupt (or truncated )?\.npz surface file",
    "not_npz": "not a surface file: expected a .npz archive",
    "empty": "found an empty file",
    "object_array": "pickled object array",
    "no_meta": "no 'meta' entry",
    "meta_not_json": "'meta' entry is not valid JSON",
    "newer_version": "format_version 99",
    "values_shape": r"value_loss has shape \(5, 3\) but the coordinates give a grid of shape \(5, 4\)",
    "mask_missing": r"missing \['mask'\]",
    "mask_shape": r"mask has shape \(4, 5\)",
    "mask_float": "mask must be an array of booleans, got elements of type float64",
    "mask_int": r"mask must hold booleans \(or 0/1\)",
    "unknown_metric": r"unknown metric name\(s\) \['error'\]",
    "unlisted_values": r"unexpected \['value_accuracy'\]",
    "coords_nan": "coords_1 must be a non-empty 1-D array of finite numbers, got shape .4,. with NaN",
    "three_directions": "3 directions for 2 coordinate axes",
}


@pytest.mark.parametrize("case, fragment", list(SURFACE_BAD.items()))
def test_corrupt_surface_files_are_refused(tmp_path, case, fragment):
    rng = np.random.default_rng(0)
    s = make_surface()
    s.values["loss"] = rng.random((5, 4))
    s.directions[0]["w"] = torch.randn(
        60, 60, generator=torch.Generator().manual_seed(0)
    )  # incompressible bulk mid-file
    path = s.save(tmp_path / "s.npz")
    assert zipfile.is_zipfile(path)
    _damage_surface(path, case)
    with pytest.raises(ValueError, match=fragment) as info:
        load_surface(path)
    assert str(path) in str(info.value)


def test_inconsistent_surface_is_not_saved_and_json_surface_is_checked(tmp_path):
    s = make_surface()
    s.values["loss"] = s.values["loss"][:4]
    with pytest.raises(ValueError, match=r"Surface.save: value_loss has shape \(4, 4\)"):
        s.save(tmp_path / "bad.npz")
    assert list(tmp_path.iterdir()) == []
    d = make_surface().to_dict()
    del d["mask"]
    (tmp_path / "s.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match="completion mask is missing"):
        load_surface(tmp_path / "s.json")
    s2 = make_surface()
    s2.mask = None
    assert not s2.complete


# --------------------------------------------------------------------------------- result JSON files


def _trace_dict(**edits) -> dict:
    r = TraceResult(value=2.5, stderr=0.1, samples=[2.0, 3.0], matvecs=4, method="hutchinson")
    return {**r.to_dict(), **edits}


_EIGEN = EigenResult(values=torch.tensor([1.0, 2.0]), residuals=torch.tensor([0.0, 0.0])).to_dict()
_ROW = SharpnessResult(measure="worst_case", value=1.0, evaluations={"loss": "three"}).to_dict()
_TRACE_TEXT = json.dumps(_trace_dict(), indent=2)
# case -> (content of the file, fragment of the error)
_DEEP = '{"type": "TraceResult", "config": {"a": ' + "[" * 10**5 + "]" * 10**5 + "}}"
_T = "field TraceResult"
RESULT_BAD = {
    "truncated": (_TRACE_TEXT[:150], r"not a valid result file.*\(line \d+, column \d+\); the file is trunc"),
    "empty": ("  \n", "the result file .* is empty"),
    "binary": (b"\x00\xff\xfe garbage", "is not UTF-8 text"),
    "top_level_list": ([1, 2], "holds a JSON object, found a list"),
    "unknown_type": (
        _trace_dict(type="MagicResult"),
        "unknown result type 'MagicResult'; known types: .*Trace",
    ),
    "no_type": ({k: v for k, v in _trace_dict().items() if k != "type"}, "no 'type' field"),
    "type_not_str": (_trace_dict(type=3), "'type' must be a class name"),
    "float_field_str": (_trace_dict(value="abc"), rf"{_T}\.value: expected float, got str 'abc'"),
    "int_field_float": (_trace_dict(matvecs=4.5), rf"{_T}\.matvecs: expected int, got float 4\.5"),
    "bool_as_int": (_trace_dict(matvecs=True), rf"{_T}\.matvecs: expected int, got bool"),
    "list_elem": (_trace_dict(samples=[1.0, "2"]), rf"{_T}\.samples\[1\]: expected float, got str"),
    "config_not_dict": (_trace_dict(config=[1, 2]), rf"{_T}\.config: expected dict"),
    "unknown_field": (_trace_dict(valeu=1.0), r"unknown field\(s\) \['valeu'\] for a TraceResult"),
    "ragged_tensor": ({**_EIGEN, "values": [[1.0], [1, 2]]}, r"EigenResult\.values: expected a rectangular"),
    "string_tensor": (
        {**_EIGEN, "residuals": ["a", "b"]},
        r"EigenResult\.residuals: .* elements of type <U1",
    ),
    "nested_row": (
        {"type": "SharpnessReport", "rows": [_ROW]},
        r"rows\[0\]: .*\.evaluations\['loss'\]: expected int",
    ),
    "deep_nesting": (_DEEP, "nests too deeply"),
    "npz": (None, "a zip/.npz archive, not a result file .*loaded with landscape.load_surface"),
}


@pytest.mark.parametrize("case", list(RESULT_BAD))
def test_bad_result_files(tmp_path, case):
    path = tmp_path / "r.json"
    content, fragment = RESULT_BAD[case]
    if case == "npz":
        make_surface().save(path)
    elif isinstance(content, (str, bytes)):
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    else:
        path.write_text(json.dumps(content))
    with pytest.raises(ValueError, match=fragment) as info:
        load_result(path)
    assert str(path) in str(info.value)


def test_from_dict_refuses_a_different_result_class_and_accepts_a_good_file(tmp_path):
    with pytest.raises(ValueError, match="the result is of type EigenResult, which is not a TraceResult"):
        TraceResult.from_dict(EigenResult().to_dict())
    with pytest.raises(ValueError, match="a result must be a JSON object"):
        Result.from_dict([("value", 1.0)])
    path = tmp_path / "ok.json"
    path.write_text(json.dumps(_trace_dict()))
    back = load_result(path)
    assert (back.value, back.stderr, back.samples, back.matvecs) == (2.5, 0.1, [2.0, 3.0], 4)
    with pytest.raises(FileNotFoundError, match="no such result file"):
        load_result(tmp_path / "missing.json")
