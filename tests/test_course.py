"""Unit tests of helpers.course (the notebook preamble, size tables, exercise checks, show_source)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import course

ROOT = Path(__file__).resolve().parent.parent


def test_setup_applies_the_environment_and_reports_missing_gpu(monkeypatch, capsys):
    monkeypatch.setenv("COURSE_QUICK", "1")
    monkeypatch.setenv("COURSE_DEVICE", "cpu")
    monkeypatch.setattr(course, "_display_markdown", print)
    lesson = course.setup("01_categorical_labels_on_the_gpu", False, "auto", note="Only the CPU curve is measured.")
    out = capsys.readouterr().out
    assert lesson.quick is True and lesson.device == torch.device("cpu") and lesson.mode == "quick"
    assert "**Your hardware**" in out and "quick mode: True" in out
    assert "**No GPU in use here.** Only the CPU curve is measured." in out
    assert ("No GPU reference result is committed yet" in out) == (not lesson.reference)


def test_setup_without_gpu_needs_shows_no_notice(monkeypatch, capsys):
    monkeypatch.delenv("COURSE_QUICK", raising=False)
    monkeypatch.setenv("COURSE_DEVICE", "cpu")
    monkeypatch.setattr(course, "_display_markdown", print)
    lesson = course.setup("00_getting_started", False, "auto", needs=None)
    assert "No GPU" not in capsys.readouterr().out
    assert lesson.mode == "cpu" and not lesson.on_gpu


def test_setup_rejects_an_unknown_device(monkeypatch):
    monkeypatch.delenv("COURSE_DEVICE", raising=False)
    with pytest.raises(ValueError, match="unknown device 'gpu'"):
        course.setup("00_getting_started", False, "gpu")


def _lesson(quick, dev="cpu"):
    return course.Lesson("99_demo", quick, torch.device(dev), {"name": "x"})


def test_sizes_table_picks_the_column_of_the_mode():
    table = dict(quick={"epochs": 1}, cpu={"epochs": 5}, gpu={"epochs": 60})
    assert _lesson(True).sizes(**table).epochs == 1
    assert _lesson(False).sizes(**table).epochs == 5
    assert _lesson(False, "meta").sizes(**table).epochs == 5  # neither CUDA nor MPS: the CPU column
    gpu = course.Lesson("99_demo", False, torch.device("cpu"), {})
    gpu.device = torch.device("cuda", 0)  # a torch.device needs no GPU to exist
    assert gpu.on_gpu and gpu.sizes(**table).epochs == 60
    with pytest.raises(ValueError, match="different sizes"):
        _lesson(True).sizes(quick={"epochs": 1}, cpu={"epochs": 2, "batch": 3}, gpu={"epochs": 3})


def test_an_apple_gpu_gets_the_gpu_sizes_only_with_the_memory_for_them(monkeypatch, capsys):
    table = dict(quick={"batch": 8}, cpu={"batch": 128}, gpu={"batch": 2048})
    mac = _lesson(False, "mps")  # a torch.device needs no Mac to exist
    monkeypatch.setattr(course.devices, "apple_gpu_gib", lambda: 5.3)  # an 8 GB Mac, say
    assert mac.mode == "cpu" and mac.sizes(**table).batch == 128
    assert "uses the CPU column" in capsys.readouterr().out
    monkeypatch.setattr(course.devices, "apple_gpu_gib", lambda: course.APPLE_GPU_MIN_GIB + 2.0)
    assert mac.mode == "gpu" and mac.sizes(**table).batch == 2048
    assert _lesson(True, "mps").sizes(**table).batch == 8


def test_save_writes_a_results_file(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COURSE_RESULTS_DIR", str(tmp_path))
    path = _lesson(True).save({"value": torch.tensor(2.5)})
    rec = json.loads(path.read_text())
    assert rec["notebook"] == "99_demo" and rec["quick"] is True and rec["results"] == {"value": 2.5}
    assert "recorded:" in capsys.readouterr().out


def test_show_source_is_the_real_source(monkeypatch):
    from helpers.models import SequenceClassifier

    shown = []
    monkeypatch.setattr(course, "_display_markdown", shown.append)
    code = course.show_source(SequenceClassifier)
    assert code.startswith("class SequenceClassifier(nn.Module):") and "pack_padded_sequence(" in code
    assert shown[0].startswith("`helpers/models.py`:") and code in shown[0]


def test_setup_makes_the_chosen_gpu_current(monkeypatch):
    """cuda:1 chosen: events, benchmark timers and bare synchronize() must act on GPU 1, not on cuda:0."""
    from helpers import devices

    current = []
    monkeypatch.delenv("COURSE_DEVICE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: current.append(torch.device(d)))
    monkeypatch.setattr(devices, "describe", lambda: {"name": "2x-fake-gpu"})
    monkeypatch.setattr(devices, "describe_markdown", lambda hw: "")
    monkeypatch.setattr(course, "_display_markdown", lambda text: None)
    lesson = course.setup("00_getting_started", False, "cuda:1", needs=None)
    assert lesson.device == torch.device("cuda", 1) and current == [torch.device("cuda", 1)]
    assert devices.make_current("cpu") == torch.device("cpu") and len(current) == 1


def test_within_budget_sizes_work_to_the_time_left_and_says_so(capsys, monkeypatch):
    from helpers import course

    clock = [1000.0]
    monkeypatch.setattr(course.time, "monotonic", lambda: clock[0])
    lesson = _lesson(False)
    assert lesson.within_budget(60, 2.0) == 60 and capsys.readouterr().out == ""  # no budget: the full run
    assert lesson.seconds_left() is None and lesson.affords(1e9, "anything")
    lesson.budget_s, lesson.started = 100, clock[0]
    assert lesson.within_budget(60, 2.0, share=0.5) == 25
    assert "25 of 60 epochs" in capsys.readouterr().out
    assert lesson.within_budget(60, 500.0, minimum=2) == 2
    assert lesson.within_budget(10, 1.0) == 10
    clock[0] += 60  # 60 s of the 100 spent: what is left counts, not the whole budget
    assert lesson.seconds_left() == 40 and lesson.within_budget(60, 2.0, share=0.5) == 10
    assert lesson.affords(30, "a compile") and not lesson.affords(50, "a compile")
    assert "a compile left out (needs about 50 s, 40 s left" in capsys.readouterr().out
    clock[0] += 100
    assert lesson.seconds_left() == 0


def test_the_budget_counts_from_when_the_run_started_the_notebook(monkeypatch):
    """tools/run_course.py passes COURSE_STARTED (wall-clock seconds): the kernel's start and the imports before
    setup() count against budget_s, as they do in the run's plan. Without it the budget counts from setup()."""
    from helpers import course

    monkeypatch.setattr(course.time, "monotonic", lambda: 500.0)
    monkeypatch.setattr(course.time, "time", lambda: 2_000_000.0)
    monkeypatch.setenv("COURSE_STARTED", str(2_000_000.0 - 12))  # the process began 12 s ago
    lesson = _lesson(False)
    lesson.budget_s = 100
    assert lesson.started == 488.0 and lesson.seconds_left() == 88
    monkeypatch.setenv("COURSE_STARTED", "not a time")
    assert _lesson(False).started == 500.0
    monkeypatch.delenv("COURSE_STARTED")
    assert _lesson(False).started == 500.0


def test_solution_is_shown_not_run_unless_asked(tmp_path, monkeypatch):
    from helpers import results

    (tmp_path / "solutions").mkdir()
    (tmp_path / "solutions" / "99_demo.py").write_text(
        '"""doc"""\n# %% exercise 1\nanswer = 6 * 7\n\n# %% exercise 2\nanswer = "two"\n')
    (tmp_path / "pyproject.toml").write_text("")  # a checkout
    monkeypatch.setattr(results, "project_root", lambda: tmp_path)
    shown = []
    monkeypatch.setattr(course, "_display_markdown", shown.append)
    monkeypatch.delenv("COURSE_RUN_SOLUTIONS", raising=False)
    assert course.solution_sections("99_demo") == {1: "answer = 6 * 7\n", 2: 'answer = "two"\n'}
    global answer
    answer = None
    course.solution("99_demo", 1)
    assert answer is None and "not run" in shown[-1] and "answer = 6 * 7" in shown[-1]
    course.solution("99_demo", 1, run=True)
    assert answer == 42
    monkeypatch.setenv("COURSE_RUN_SOLUTIONS", "1")  # what make test sets: CI proves every solution
    course.solution("99_demo", 2)
    assert answer == "two"


def test_the_profiler_prints_no_log_lines_on_a_machine_without_cuda():
    """Kineto printed "USDT … profiler_start" and "ERROR … gpuGetDeviceCount failed" under every profiled cell of a
    CPU-only run (lessons 03 and 09 on the site): setup() silences it there, unless the learner set the level."""
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine keeps Kineto's messages (they can matter there)")
    code = ("import os; os.environ.pop('KINETO_LOG_LEVEL', None)\n"
            "from helpers.course import setup\n"
            "setup('09_profiler_and_memory', True, 'cpu', needs=None)\n"
            "import torch\nfrom torch.profiler import ProfilerActivity, profile\n"
            "with profile(activities=[ProfilerActivity.CPU]):\n    torch.randn(8).sum()\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stderr[-800:]
    assert "USDT" not in run.stderr and "ERROR" not in run.stderr, run.stderr[-800:]


def test_setup_keeps_the_learners_own_kineto_level(monkeypatch):
    monkeypatch.setenv("KINETO_LOG_LEVEL", "3")
    course.setup("09_profiler_and_memory", True, "cpu", needs=None)
    assert os.environ["KINETO_LOG_LEVEL"] == "3"
    monkeypatch.delenv("KINETO_LOG_LEVEL")
    course.setup("09_profiler_and_memory", True, "cpu", needs=None)
    assert os.environ.get("KINETO_LOG_LEVEL") == (None if torch.cuda.is_available() else "6")


def test_a_partial_save_keeps_the_plain_data_measured_so_far(tmp_path, monkeypatch):
    """Under a time budget the lesson saves its plain-data variables after every cell, marked partial, until its
    own save writes the whole record (issue 34: a notebook stopped at its limit leaves what it measured)."""
    import json

    from helpers import course

    monkeypatch.setenv("COURSE_RESULTS_DIR", str(tmp_path))
    lesson = course.Lesson("99_demo", True, torch.device("cpu"), {"name": "test"}, budget_s=30)
    namespace = {"step_ms": {"fp32": 1.5, "bf16": [0.9, 1.0]}, "model": torch.nn.Linear(2, 2), "_private": 1,
                 "quick": True, "x": torch.ones(3), "note": "measured", "huge": list(range(20_000)), "empty": {}}
    path = lesson.save_partial(namespace)
    record = json.loads(path.read_text())
    assert record["partial"] is True and record["budget_s"] == 30
    assert record["results"] == {"step_ms": {"fp32": 1.5, "bf16": [0.9, 1.0]}, "note": "measured"}
    lesson.save({"step_ms": 1.5})
    assert json.loads(path.read_text())["partial"] is False
    assert lesson.save_partial(namespace) is None, "after the whole record, no partial one overwrites it"
