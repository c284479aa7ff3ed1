"""Unit tests of helpers.results: results files, reference results and the run report."""
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import results

HW = {"name": "cpu-test-2t", "cpu": "Test CPU", "cpu_cores": 2, "gpus": [], "torch": "2.x"}


def test_save_and_load_round_trip(tmp_path):
    path = results.save_results("00_demo", {"gflops": {64: np.float32(1.5), "big": torch.tensor(2.0)},
                                            "sizes": (1, 2), "nan": math.nan},
                                quick=True, device="cpu", out_dir=tmp_path, hardware=HW)
    assert path == tmp_path / "00_demo.json"
    rec = results.load_results(path)
    assert rec["schema"] == 1 and rec["quick"] is True and rec["device"] == "cpu"
    assert rec["results"] == {"gflops": {"64": 1.5, "big": 2.0}, "sizes": [1, 2], "nan": None}
    assert rec["hardware"]["name"] == "cpu-test-2t" and "T" in rec["timestamp"]


def test_default_location_follows_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_RESULTS_DIR", str(tmp_path / "r"))
    path = results.save_results("00_demo", {"x": 1}, quick=False, device="cpu", hardware=HW)
    assert path.parent == tmp_path / "r"
    monkeypatch.delenv("COURSE_RESULTS_DIR")
    assert results.results_dir() == results.project_root() / "build" / "results"


def test_unstorable_value_is_a_clear_error(tmp_path):
    with pytest.raises(TypeError, match="cannot store a object"):
        results.save_results("x", {"bad": object()}, quick=True, device="cpu", out_dir=tmp_path, hardware=HW)
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_load_rejects_files_without_schema(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"results": {}}))
    with pytest.raises(ValueError, match="missing schema"):
        results.load_results(bad)


def test_reference_results_are_keyed_by_hardware(tmp_path):
    for hw in ("1x-nvidia-h200", "cpu-x-2t"):
        results.save_results("02_demo", {"v": 1}, quick=False, device="x", out_dir=tmp_path / hw,
                             hardware=dict(HW, name=hw))
    refs = results.load_reference("02_demo", root=tmp_path)
    assert sorted(refs) == ["1x-nvidia-h200", "cpu-x-2t"]
    assert results.load_reference("99_none", root=tmp_path) == {}


def test_work_dir_is_per_process_and_cleans_up_finished_runs(tmp_path, monkeypatch):
    import os

    (tmp_path / "pyproject.toml").write_text("")  # a checkout
    monkeypatch.setattr(results, "project_root", lambda: tmp_path)
    stale = tmp_path / "build" / "work" / "nb" / "run-999999999"  # no such process
    stale.mkdir(parents=True)
    (stale / "big.pt").write_bytes(b"x")
    path = results.work_dir("nb")
    assert path == tmp_path / "build" / "work" / "nb" / f"run-{os.getpid()}" and path.is_dir()
    assert not stale.exists()
    assert results.work_dir("nb") == path  # the same run keeps its folder


def test_shown_path_names_no_folder_of_this_machine_inside_the_course(tmp_path, monkeypatch):
    root = results.project_root()
    assert results.shown_path(root / "build" / "traces" / "t.json") == "build/traces/t.json"
    monkeypatch.chdir(root / "notebooks")  # JupyterLab's working directory: a relative path resolves from there
    assert results.shown_path(Path("../build/work/x.pt")) == "build/work/x.pt"
    assert results.shown_path(tmp_path / "elsewhere.pt") == str(tmp_path / "elsewhere.pt")
    monkeypatch.setenv("COURSE_BUILD_DIR", str(tmp_path / "out" / "build"))  # make gpu-check: outside the course
    assert results.shown_path(tmp_path / "out" / "build" / "work" / "ck.pt") == "build/work/ck.pt"
