"""tools/run_course.py under a time budget: deadlines that hold, every ending named, the report always written.

The notebooks here are the test's own (a folder of their own, not notebooks/): one sleeps past its limit, one
kills its kernel, one starts torchrun ranks and then sleeps, one is fine. The run must stop the first and third
with their whole process tree, name all three endings in one line each, run the fourth, and write times.json and
report.md. About 45 s on 2 cores.
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from helpers.results import save_results

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
try:
    import run_course
finally:
    sys.path.remove(str(ROOT / "tools"))


def _notebook(folder: Path, name: str, *cells: str) -> None:
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("quick = False\ndevice = 'auto'\nbudget_s = None")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params] + [nbformat.v4.new_code_cell(c) for c in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, folder / f"{name}.ipynb")


def _alive_with(marker: str) -> list:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                found.append(int(pid))
        except OSError:
            pass
    return found


@pytest.fixture(scope="module")
def budget_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("budget-run")
    nbs = tmp / "notebooks"
    nbs.mkdir()
    sleeper = tmp / "rank_sleeper.py"  # its path is the marker of the ranks in the process table
    sleeper.write_text("import time\ntime.sleep(900)\n")
    up = tmp / "ranks-up"
    # 21 measures, then starts torchrun as helpers.launcher does and sleeps with its ranks until it is stopped
    _notebook(nbs, "21_sleeps", "print('budget', budget_s)\nfrom helpers.course import setup\n"
              "lesson = setup('21_sleeps', quick, 'cpu', needs=None, budget_s=budget_s)",
              "measured = {'first section': [1.5, 2.5]}", f"""import os, subprocess, sys, time
subprocess.Popen([sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2',
                  {str(sleeper)!r}], start_new_session=True)
def ranks():
    return [p for p in filter(str.isdigit, os.listdir('/proc'))
            if {str(sleeper)!r} in open(f'/proc/{{p}}/cmdline', 'rb').read().decode(errors='replace')]
t0 = time.time()
while len(ranks()) < 3 and time.time() - t0 < 60:  # torchrun and its two ranks
    time.sleep(0.2)
open({str(up)!r}, 'w').write(str(len(ranks())))
time.sleep(900)""")
    _notebook(nbs, "22_dies", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
    _notebook(nbs, "24_fine", "print(6 * 7)")
    # floors of 1 s, equal weights (21, 22, 24 have no share of their own) in 48 s: 21 is stopped at 1.3 x about
    # 16 s = 21 s (its torchrun and ranks are up after about 8 s on a 2-core CPU), and 24 still fits
    out, floors = tmp / "out", tmp / "floors.json"
    floors.write_text(json.dumps({"kinds": {"cpu": {"floors_s": {"21": 1, "22": 1, "24": 1}, "machine": "test",
                                                    "torch": "test", "date": "today"}}}))
    t0 = time.perf_counter()
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "run_course.py"), "--notebooks", str(nbs),
                          "--device", "cpu", "--quick", "--keep-going", "--budget-s", "48", "--limit-grace", "0",
                          "--floors", str(floors), "--out", str(out)], capture_output=True, text=True, timeout=600,
                         cwd=ROOT)
    return dict(run=run, out=out, seconds=time.perf_counter() - t0, sleeper=str(sleeper), up=up)


@pytest.mark.serial  # budget_run's ranks must be up (about 8 s) before its 21 s limit
def test_a_notebook_past_its_limit_is_stopped_and_the_run_goes_on(budget_run):
    run, out = budget_run["run"], budget_run["out"]
    assert run.returncode == 1, run.stdout + run.stderr
    assert "21_sleeps.ipynb ... (budget" in run.stdout and "STOPPED after" in run.stdout
    assert "[3/3] 24_fine.ipynb" in run.stdout and "done in" in run.stdout.split("24_fine")[1]
    times = json.loads((out / "times.json").read_text())
    assert times["runs"]["21_sleeps"]["status"] == "stopped"
    assert times["notebooks"] == {"24_fine": pytest.approx(times["runs"]["24_fine"]["seconds"], abs=0.1)}
    report = (out / "report.md").read_text()
    assert "| 21_sleeps | stopped |" in report and "| 24_fine | ok |" in report
    partial = json.loads((out / "results" / "21_sleeps.json").read_text())
    assert partial["partial"] is True and partial["stopped"] is True, "what it measured before the stop is kept"
    assert partial["results"]["measured"] == {"first section": [1.5, 2.5]}
    assert "| 21_sleeps | stopped |" in report and "partial results" in report
    saved = nbformat.read(out / "notebooks" / "21_sleeps.ipynb", as_version=4)
    assert any("budget" in o.get("text", "") for c in saved.cells for o in c.get("outputs", [])), \
        "what the notebook did before the stop is kept"


@pytest.mark.serial  # budget_run's ranks must be up (about 8 s) before its 21 s limit
def test_a_dead_kernel_is_named_in_one_line(budget_run):
    run, out = budget_run["run"], budget_run["out"]
    assert json.loads((out / "times.json").read_text())["runs"]["22_dies"]["status"] == "died"
    lines = [ln for ln in run.stderr.splitlines() if "22_dies" in ln and ln.startswith("error:")]
    assert len(lines) == 1 and "DeadKernelError" in lines[0] and "cell 2" in lines[0], run.stderr


@pytest.mark.serial  # budget_run's ranks must be up (about 8 s) before its 21 s limit
def test_a_stopped_notebook_leaves_no_torchrun_rank_behind(budget_run):
    assert budget_run["up"].read_text() == "3", "torchrun and both ranks were running when the notebook was stopped"
    assert json.loads((budget_run["out"] / "times.json").read_text())["runs"]["21_sleeps"]["status"] == "stopped"
    assert _alive_with(budget_run["sleeper"]) == []


def test_budget_plan_gives_floors_first_and_the_rest_by_weight():
    floors = {"00": 10.0, "05": 100.0}
    both = ["00", "05"]
    b00, b05 = (run_course.plan_budget(p, both, 400.0, floors) for p in both)
    w = run_course.BUDGET_SHARE
    assert b00 == pytest.approx(10 + 290 * w["00"] / (w["00"] + w["05"]))
    assert b00 + b05 == pytest.approx(400.0)
    assert run_course.plan_budget("05", ["05"], 400.0, floors) == pytest.approx(400.0), "ONLY= renormalises"


def test_what_does_not_fit_is_left_out_largest_first_and_the_split_fits():
    floors = {"00": 10.0, "01": 20.0, "05": 100.0, "06": 50.0}
    assert run_course.fit(list(floors), 90.0, floors) == ["00", "01", "06"]
    groups = run_course.split(list(floors), 90.0, floors)
    assert groups[0] == ["00", "01", "06"] and sorted(sum(groups, [])) == sorted(floors)
    assert all(sum(floors[p] for p in g) <= 90.0 for g in groups if len(g) > 1), groups
    assert run_course.start("05", ["05"], 90.0, None, floors) is None, "a floor above the time left never starts"


def test_time_limit_never_passes_the_run_deadline():
    assert run_course.time_limit(100.0, None, 0.0) == pytest.approx(run_course.LIMIT_FACTOR * 100 + run_course.LIMIT_GRACE_S)
    assert run_course.time_limit(100.0, 160.0, 20.0) == pytest.approx(140.0)
    budget, limit = run_course.start("00", ["00", "05"], 400.0, 120.0, {"00": 10.0, "05": 100.0})
    assert budget == pytest.approx(20 / run_course.LIMIT_FACTOR) and limit == pytest.approx(20.0), \
        "the budget shrinks so that LIMIT_FACTOR x budget still ends before the later floors' share of the deadline"


def test_a_device_never_recorded_learns_its_floors_from_the_first_notebooks():
    floors = {"00": 10.0, "01": 20.0, "05": 200.0}
    runs = {"00_a": {"status": "ok", "seconds": 2.0}, "01_b": {"status": "ok", "seconds": 5.0},
            "02_c": {"status": "stopped", "seconds": 99.0}}
    learned, scale = run_course.learn(floors, runs)
    assert scale == pytest.approx(0.25) and learned["05"] == pytest.approx(50.0), "the slowest ratio of those that ended"
    assert run_course.learn(floors, {"00_a": {"status": "ok", "seconds": 30.0}})[1] == 1.0, "never above the CPU's"
    assert run_course.learn(floors, {})[1] == 1.0


def _gpu_check_plan(budget_min: float, cifar: bool, took):
    """make gpu-check's notebooks at BUDGET_MIN, planned from the committed CPU floors as tools/gpu_check.py divides
    its budget (PLAN_SETUP_S before the notebooks), when each notebook takes ``took(budget_s, limit_s)``."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(ROOT / "tools"))
    args = gpu_check._parse(["--out", "x", "--budget-min", str(budget_min)])
    budget = gpu_check.notebook_share(args, gpu_check.PLAN_SETUP_S)
    deadline_left = (60 * budget_min + gpu_check.DEADLINE_GRACE_S - gpu_check.PACK_RESERVE_S - 5
                     - gpu_check.PLAN_SETUP_S)
    floors, _, own = run_course.load_floors("cpu")
    assert own
    prefixes = [nb.name[:2] for nb in run_course.notebooks(None)]
    if not cifar:
        prefixes = [p for p in prefixes if p not in gpu_check.CIFAR_NOTEBOOKS.split(",")]
    return run_course.plan_run(prefixes, budget, deadline_left, floors, took=took), budget, floors, prefixes


@pytest.mark.parametrize("budget_min", [5, 7, 12])
@pytest.mark.parametrize("cifar", [True, False])
@pytest.mark.parametrize("pace", ["on budget", "every notebook runs to its limit"])
def test_the_gpu_check_plan_starts_no_notebook_it_cannot_give_its_floor(budget_min, cifar, pace):
    """The committed floors at BUDGET_MIN 5, 7 and 12, with and without CIFAR: every notebook that starts has
    budget_s >= its floor and a limit >= LIMIT_FACTOR x budget_s, even when every earlier one runs to its limit (the
    5 s limits of issue 34 cannot happen); what does not fit is named."""
    took = (lambda b, limit: b) if pace == "on budget" else (lambda b, limit: limit)
    plan, budget, floors, prefixes = _gpu_check_plan(budget_min, cifar, took)
    started = [s for s in plan if s["budget_s"] is not None]
    assert started, "something runs"
    for s in started:
        assert s["budget_s"] >= s["floor_s"], s
        assert s["limit_s"] >= run_course.LIMIT_FACTOR * s["budget_s"] - 1e-9, s
    if pace == "on budget":
        assert started[-1]["at_s"] <= budget + 1e-6, "planned on budget, the notebooks end inside it"
        left_out = [s["prefix"] for s in plan if s["budget_s"] is None]
        assert left_out == [p for p in prefixes if p not in run_course.fit(prefixes, budget, floors)]
        assert bool(left_out) == (sum(floors[p] for p in prefixes) > budget)


def test_the_dry_run_prints_the_plan_and_runs_nothing(tmp_path):
    out = tmp_path / "never-made"
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_check.py"), "--out", str(out), "--budget-min", "7",
                          "--cifar10", "somewhere.tar.gz", "--device", "cpu", "--plan"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith("gpu-check: dry run: budget 420 s"), lines[0]
    split_line = [ln for ln in lines if ln.startswith("plan: the floors of these notebooks add up to")]
    assert len(split_line) == 1, lines
    floors = json.loads((ROOT / "data" / "budget_floors.json").read_text())["kinds"]["cpu"]["floors_s"]
    floor_05 = floors["05_multi_gpu_training"]
    assert f"05 ({floor_05:.0f} s)" in split_line[0], split_line  # the committed floors, whatever they are today
    rows = [ln for ln in lines if ln.startswith("[")]
    left_out = [r.split("] ", 1)[1][:2] for r in rows if "not run: budget" in r]
    kept = [r.split("] ", 1)[1][:2] for r in rows if "not run: budget" not in r]
    assert len(rows) == 12 and "05" in left_out and len(kept) >= 8, rows  # 05 is the largest floor: out first
    assert f"ONLY={','.join(kept)} and ONLY={','.join(left_out)}" in split_line[0], split_line
    assert all("budget" in r and "limit" in r for r in rows if "not run" not in r)
    assert lines[-1].startswith("plan: the notebooks end about")
    assert not out.exists(), "a dry run writes nothing"


def test_the_rest_of_a_run_is_planned_in_the_units_its_notebooks_really_took():
    """Notebooks that took 1.25x their budget_s so far: the time left is divided as if the rest will too (a budget
    of floor + share, in seconds of 1.25x), so the last notebooks still get their floors instead of being dropped."""
    runs = {"00_a": {"status": "ok", "seconds": 25.0, "budget_s": 20.0},
            "01_b": {"status": "stopped", "seconds": 99.0, "budget_s": 10.0},
            "02_c": {"status": "ok", "seconds": 12.5, "budget_s": 10.0}}
    assert run_course.overrun(runs) == pytest.approx(1.25)
    assert run_course.overrun({"00_a": {"status": "ok", "seconds": 5.0, "budget_s": 20.0}}) == 1.0, "never below 1"
    assert run_course.overrun({}) == 1.0


REPORT_HW = {"name": "test-cpu", "cpu": "Test CPU", "cpu_cores": 2, "gpus": [], "torch": "2.x"}


def test_report_collects_every_result(tmp_path):
    save_results("00_a", {"speed": 1.23456, "curve": {"1": 2.0}}, quick=True, device="cpu", out_dir=tmp_path,
                         hardware=REPORT_HW)
    save_results("01_b", {"acc": 0.95}, quick=False, device="cpu", out_dir=tmp_path, hardware=REPORT_HW)
    out = run_course.write_report(tmp_path, tmp_path / "report.md")
    text = out.read_text()
    assert "## 00_a" in text and "## 01_b" in text and "| `speed` | 1.235 |" in text
    assert "Test CPU" in text and "quick mode: True" in text
