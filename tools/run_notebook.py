"""The course's one notebook executor (papermill): a run of one notebook, or storing the outputs nbval checks.

    python tools/run_notebook.py NOTEBOOK EXECUTED PARAMETERS_JSON STATUS_JSON   # run by tools/run_course.py
    python tools/run_notebook.py --store notebooks/00_getting_started.ipynb [...]

--store executes each notebook in quick mode on the CPU and writes it back *without* outputs except in cells
marked `# NBVAL_CHECK_OUTPUT`, whose stored outputs are deterministic facts that nbval re-checks in CI. Run it after
editing a notebook (tests/test_notebooks.py fails until you do).

tools/run_course.py starts this in a process session of its own, so that a notebook past its time limit can be
stopped with everything it started (the kernel, torchrun ranks). Whatever happens here — an error in a cell, a
kernel that dies or never starts — ends as one line in STATUS_JSON: {"status": "ok" | "failed" | "died",
"message": ..., "cell": ...}. No status file at all means this process itself was killed.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

CHECK = "# NBVAL_CHECK_OUTPUT"


def execute(notebook: Path, executed: Path | None, params: dict):
    """Run ``notebook`` in a fresh kernel in its own folder; return the executed notebook (written to ``executed``
    unless None)."""
    import papermill as pm

    return pm.execute_notebook(str(notebook), None if executed is None else str(executed), parameters=params,
                               kernel_name="python3", cwd=str(notebook.parent), progress_bar=False, start_timeout=180)


def strip(nb) -> None:
    """Drop outputs everywhere but in checked cells, and what the run added to the metadata; number checked cells
    1, 2, ... in order."""
    nb.metadata.pop("papermill", None)
    count = 0
    for cell in nb.cells:
        for key in ("execution", "papermill"):
            cell.metadata.pop(key, None)
        if cell.metadata.get("tags") == []:
            del cell.metadata["tags"]
        if cell.cell_type != "code":
            continue
        if cell.source.lstrip().startswith(CHECK):
            count += 1
            cell.execution_count = count
            for out in cell.outputs:
                if "execution_count" in out:
                    out["execution_count"] = count
                out.pop("metadata", None) if out.get("output_type") == "stream" else None
        else:
            cell.outputs = []
            cell.execution_count = None


def store(paths: list[str]) -> int:
    import nbformat

    os.environ.update(COURSE_QUICK="1", COURSE_DEVICE="cpu", COURSE_RUN_SOLUTIONS="1")
    os.environ.setdefault("COURSE_RESULTS_DIR", str(Path("build/store-outputs-results").resolve()))
    for path in map(Path, paths):
        nb = execute(path.resolve(), None, {})
        strip(nb)
        nbformat.write(nb, path)
        print(f"stored checked outputs of {path.name}")
    return 0


def failing_cell(executed: Path) -> str:
    """Name the failing cell by its position in the *source* notebook and its first line ("" if unknown)."""
    import nbformat

    try:
        cells = [c for c in nbformat.read(executed, as_version=4).cells  # drop what papermill added
                 if not {"injected-parameters", "papermill-error-cell-tag"} & set(c.metadata.get("tags", []))]
    except (OSError, ValueError):
        return ""
    def name(i):
        first = next((line for line in cells[i].source.splitlines()
                      if line.strip() and not line.startswith("# NBVAL")), "")
        return f"cell {i + 1} (counting from 1, `{first[:60]}`)"

    for i, cell in enumerate(cells):
        if any(o.get("output_type") == "error" for o in cell.get("outputs", [])):
            return name(i)
    started = [i for i, c in enumerate(cells)  # a dead kernel: the last cell papermill started
               if c.cell_type == "code" and c.metadata.get("papermill", {}).get("status") in ("running", "completed")]
    return f"the last cell that ran, {name(started[-1])}" if started else ""


def main(argv: list) -> int:
    if argv[:1] == ["--store"]:
        return store(argv[1:])
    notebook, executed, params, status_file = Path(argv[0]), Path(argv[1]), json.loads(argv[2]), Path(argv[3])
    status = {"status": "ok"}
    try:
        execute(notebook, executed, params)
    except Exception as exc:  # noqa: BLE001 - every way a notebook can fail must end in the status file
        cell = failing_cell(executed)
        if type(exc).__name__ == "PapermillExecutionError":
            status = {"status": "failed", "message": f"{exc.ename}: {exc.evalue}".strip(), "cell": cell}
        else:  # DeadKernelError, a kernel that never started, a broken install
            name = type(exc).__name__
            status = {"status": "died", "message": f"{name}: {str(exc).strip().splitlines()[0] if str(exc).strip() else name}",
                      "cell": cell}
    status_file.write_text(json.dumps(status), encoding="utf-8")
    return 0 if status["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
