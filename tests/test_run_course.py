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
    _notebook(nbs, "01_sleeps", "print('budget', budget_s)", "import time\ntime.sleep(900)")
    _notebook(nbs, "02_dies", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
    _notebook(nbs, "03_torchrun", f"""import os, subprocess, sys, time
subprocess.Popen([sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2',
                  {str(sleeper)!r}], start_new_session=True)  # as helpers.launcher starts torchrun
def ranks():
    return [p for p in filter(str.isdigit, os.listdir('/proc'))
            if {str(sleeper)!r} in open(f'/proc/{{p}}/cmdline', 'rb').read().decode(errors='replace')]
t0 = time.time()
while len(ranks()) < 3 and time.time() - t0 < 60:  # torchrun and its two ranks
    time.sleep(0.2)
open({str(up)!r}, 'w').write(str(len(ranks())))
time.sleep(900)""")
    _notebook(nbs, "04_fine", "print(6 * 7)")
    out = tmp / "out"
    t0 = time.perf_counter()
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "run_course.py"), "--notebooks", str(nbs),
                          "--device", "cpu", "--quick", "--keep-going", "--budget-s", "8", "--limit-grace", "20",
                          "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    return dict(run=run, out=out, seconds=time.perf_counter() - t0, sleeper=str(sleeper), up=up)


def test_a_notebook_past_its_limit_is_stopped_and_the_run_goes_on(budget_run):
    run, out = budget_run["run"], budget_run["out"]
    assert run.returncode == 1, run.stdout + run.stderr
    assert "01_sleeps.ipynb ... (budget" in run.stdout and "STOPPED after" in run.stdout
    assert "[4/4] 04_fine.ipynb" in run.stdout and "done in" in run.stdout.split("04_fine")[1]
    times = json.loads((out / "times.json").read_text())
    assert times["runs"]["01_sleeps"]["status"] == "stopped"
    assert times["notebooks"] == {"04_fine": pytest.approx(times["runs"]["04_fine"]["seconds"], abs=0.1)}
    report = (out / "report.md").read_text()
    assert "| 01_sleeps | stopped |" in report and "| 04_fine | ok |" in report
    saved = nbformat.read(out / "notebooks" / "01_sleeps.ipynb", as_version=4)
    assert any("budget" in o.get("text", "") for c in saved.cells for o in c.get("outputs", [])), \
        "what the notebook did before the stop is kept"


def test_a_dead_kernel_is_named_in_one_line(budget_run):
    run, out = budget_run["run"], budget_run["out"]
    assert json.loads((out / "times.json").read_text())["runs"]["02_dies"]["status"] == "died"
    lines = [ln for ln in run.stderr.splitlines() if "02_dies" in ln and ln.startswith("error:")]
    assert len(lines) == 1 and "DeadKernelError" in lines[0] and "cell 2" in lines[0], run.stderr


def test_a_stopped_notebook_leaves_no_torchrun_rank_behind(budget_run):
    assert budget_run["up"].read_text() == "3", "torchrun and both ranks were running when the notebook was stopped"
    assert json.loads((budget_run["out"] / "times.json").read_text())["runs"]["03_torchrun"]["status"] == "stopped"
    assert _alive_with(budget_run["sleeper"]) == []


def test_budget_plan_gives_floors_first_and_the_rest_by_weight():
    floors = {"00": 10.0, "05": 100.0}
    both = ["00", "05"]
    b00, b05 = (run_course.plan_budget(p, both, 400.0, floors) for p in both)
    w = run_course.BUDGET_SHARE
    assert b00 == pytest.approx(10 + 290 * w["00"] / (w["00"] + w["05"]))
    assert b00 + b05 == pytest.approx(400.0)
    assert run_course.plan_budget("05", ["05"], 400.0, floors) == pytest.approx(400.0), "ONLY= renormalises"
    short = run_course.plan_budget("05", both, 55.0, floors)
    assert short == pytest.approx(50.0), "below the floors, the floors shrink alike"


def test_time_limit_never_passes_the_run_deadline():
    assert run_course.time_limit(100.0, None, 0.0) == pytest.approx(run_course.LIMIT_FACTOR * 100 + run_course.LIMIT_GRACE_S)
    assert run_course.time_limit(100.0, time.time() + 60, 20.0) == pytest.approx(40.0, abs=1.0)
