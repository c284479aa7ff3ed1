"""The notebooks' shape and output policy, and papermill runs. nbval itself executes every notebook.

Policy: notebooks are committed without outputs, except cells marked `# NBVAL_CHECK_OUTPUT`, which keep
their (deterministic) outputs so nbval proves them still true. `tools/run_notebook.py --store` writes them.
"""
import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import papermill as pm
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CHECK, IGNORE = "# NBVAL_CHECK_OUTPUT", "# NBVAL_IGNORE_OUTPUT"


def test_there_are_numbered_notebooks():
    assert NOTEBOOKS and NOTEBOOKS[0].name == "00_getting_started.ipynb"
    for nb in NOTEBOOKS:
        assert nb.name[:2].isdigit() and nb.name[2] == "_", f"{nb.name}: name notebooks NN_topic.ipynb"


def _parameters(nb):
    cells = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(cells) == 1, "exactly one cell must be tagged 'parameters' (papermill injects after it)"
    values = {}
    for node in ast.parse(cells[0].source).body:
        assert isinstance(node, ast.Assign), "the parameters cell holds plain assignments only (papermill parses it)"
        values[node.targets[0].id] = ast.literal_eval(node.value)
    return values


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_structure_and_output_policy(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    params = _parameters(nb)
    assert params.get("quick") is False and params.get("device") == "auto", \
        "parameters must default to full mode on the best device: quick = False, device = 'auto'"
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith(f"# {path.name[:2]} ")
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        checked = cell.source.lstrip().startswith(CHECK)
        assert not (checked and IGNORE in cell.source), f"cell {i}: both CHECK and IGNORE"
        if checked:
            assert cell.outputs and cell.execution_count, \
                f"{path.name} cell {i} is NBVAL_CHECK_OUTPUT but has no stored output: run tools/run_notebook.py --store"
        else:
            assert not cell.outputs and cell.execution_count is None, \
                f"{path.name} cell {i} has stored output but is not NBVAL_CHECK_OUTPUT: run tools/run_notebook.py --store"
        assert all(o.get("output_type") != "error" for o in cell.outputs), f"cell {i} stores an error"


# budget_s read or tested (a keyword argument, budget_s=…, passes a time limit on: diagnose's own, lesson 10)
BUDGET_WORDS = re.compile(r"\bbudget_s\b(?!=)|\.affords\(|\.within_budget\(|\.seconds_left\(|make gpu-check")
RUN_BUDGET = "run-budget"  # the tag of a cell that sizes the lesson to make gpu-check's budget (hidden, not taught)


def budget_in_the_learners_view(nb) -> list:
    """Issue 38: the cells a learner reads that mention the run's budget. Allowed: the parameters cell, the setup
    call's ``budget_s=budget_s``, and cells tagged run-budget whose source JupyterLab hides (the site drops them)."""
    found = []
    for i, cell in enumerate(nb.cells):
        tags = cell.metadata.get("tags", [])
        hidden = RUN_BUDGET in tags and cell.metadata.get("jupyter", {}).get("source_hidden") is True
        if "parameters" in tags or hidden:
            continue
        text = cell.source if cell.cell_type == "markdown" else re.sub(r"\bbudget_s=budget_s\b", "", cell.source)
        found += [(i, line.strip()[:80]) for line in text.splitlines() if BUDGET_WORDS.search(line)]
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_the_run_budget_stays_out_of_the_cells_a_learner_reads(path):
    found = budget_in_the_learners_view(nbformat.read(path, as_version=4))
    assert not found, f"{path.name}: move these into a hidden cell tagged {RUN_BUDGET!r}: {found}"


def test_the_budget_check_can_fail():
    hidden = nbformat.v4.new_code_cell("epochs = lesson.within_budget(epochs, 2.0)")
    hidden.metadata.update(tags=[RUN_BUDGET], jupyter={"source_hidden": True})
    shown = nbformat.v4.new_code_cell("lesson = setup('x', quick, device, budget_s=budget_s)\n"
                                      "if lesson.budget_s:\n  pass")
    tagged_only = nbformat.v4.new_code_cell("ok = lesson.affords(3, 'x')")
    tagged_only.metadata["tags"] = [RUN_BUDGET]
    nb = nbformat.v4.new_notebook(cells=[hidden, shown, tagged_only, nbformat.v4.new_markdown_cell("make gpu-check")])
    assert [i for i, _ in budget_in_the_learners_view(nb)] == [1, 2, 3]


def test_papermill_quick_run_from_repository_root(tmp_path):
    """papermill injects quick/device (overriding the defaults) and the run records its results."""
    env_backup = {k: os.environ.pop(k) for k in ("COURSE_QUICK", "COURSE_DEVICE") if k in os.environ}
    os.environ["COURSE_RESULTS_DIR"] = str(tmp_path / "results")
    try:
        out = tmp_path / "00.ipynb"
        pm.execute_notebook(str(ROOT / "notebooks" / "00_getting_started.ipynb"), str(out),
                            parameters={"quick": True, "device": "cpu"}, kernel_name="python3", cwd=str(ROOT),
                            progress_bar=False)
    finally:
        os.environ.update(env_backup)
        os.environ["COURSE_RESULTS_DIR"] = str(ROOT / "build" / "test-results")
    executed = nbformat.read(out, as_version=4)
    assert any("injected-parameters" in c.metadata.get("tags", []) for c in executed.cells)
    rec = json.loads((tmp_path / "results" / "00_getting_started.json").read_text())
    assert rec["quick"] is True and rec["device"] == "cpu" and rec["results"]["matmul_size"] == 512
    assert rec["results"]["matmul_gflops"]["cpu"] > 0


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_papermill_can_inject_parameters(path, tmp_path):
    """Every notebook accepts papermill's parameters (execution itself is nbval's job, once per notebook)."""
    out = tmp_path / path.name
    pm.execute_notebook(str(path), str(out), parameters={"quick": True, "device": "cpu"}, prepare_only=True,
                        kernel_name="python3")
    cells = nbformat.read(out, as_version=4).cells
    idx = [i for i, c in enumerate(cells) if "injected-parameters" in c.metadata.get("tags", [])]
    assert len(idx) == 1 and "parameters" in cells[idx[0] - 1].metadata.get("tags", [])
    assert "quick = True" in cells[idx[0]].source


def test_nbval_fails_when_a_checked_output_changes(tmp_path):
    """Guard against a silently toothless nbval set-up: a wrong stored output must fail the run."""
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell(f"{CHECK}\nprint(6 * 7)")
    cell.execution_count = 1
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="41\n")]
    nb.cells = [cell]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = tmp_path / "wrong.ipynb"
    nbformat.write(nb, path)
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--rootdir", str(tmp_path),
                          "-c", os.devnull, "--nbval-lax", "--nbval-current-env", str(path)],
                         capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert run.returncode == 1, run.stdout[-2000:]
    assert "41" in run.stdout and "42" in run.stdout


@pytest.mark.serial  # its epochs come from a timed probe within 20 s: the cores are its own
def test_a_budgeted_notebook_sizes_its_training_to_the_time_left(tmp_path):
    """make gpu-check's path through a notebook: budget_s set, the training limited in time (fit's TimePace) and
    the results recording the budget. Lesson 06 (quick) takes its budget branches: epochs from a probe, a time limit
    per precision, each printed. The full-mode proof of every notebook is the CPU rehearsal (README)."""
    os.environ["COURSE_RESULTS_DIR"] = str(tmp_path / "results")
    try:
        out = tmp_path / "06.ipynb"
        pm.execute_notebook(str(ROOT / "notebooks" / "06_mixed_precision.ipynb"), str(out),
                            parameters={"quick": True, "device": "cpu", "budget_s": 20}, kernel_name="python3",
                            cwd=str(ROOT / "notebooks"), progress_bar=False)
    finally:
        os.environ["COURSE_RESULTS_DIR"] = str(ROOT / "build" / "test-results")
    text = "".join(o.get("text", "") for c in nbformat.read(out, as_version=4).cells for o in c.get("outputs", [])
                   if o.get("output_type") == "stream")
    assert "time budget: 20 s for this notebook" in text and "of 2 epochs" in text, text[-2000:]
    rec = json.loads((tmp_path / "results" / "06_mixed_precision.json").read_text())
    assert rec["budget_s"] == 20 and rec["quick"] is True
