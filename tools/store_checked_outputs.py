"""Execute notebooks in quick mode on the CPU and keep only the outputs nbval checks.

    python tools/store_checked_outputs.py notebooks/00_getting_started.ipynb [...]

The course commits notebooks *without* outputs except in cells marked `# NBVAL_CHECK_OUTPUT`, whose
stored outputs are deterministic facts that nbval re-checks in CI. Run this after editing a notebook
(tests/test_notebooks.py fails until you do).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

CHECK = "# NBVAL_CHECK_OUTPUT"


def is_checked(cell) -> bool:
    return cell.cell_type == "code" and cell.source.lstrip().startswith(CHECK)


def strip(nb) -> None:
    """Drop outputs everywhere but in checked cells; number checked cells 1, 2, … in order."""
    count = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        cell.metadata.pop("execution", None)
        if is_checked(cell):
            count += 1
            cell.execution_count = count
            for out in cell.outputs:
                if "execution_count" in out:
                    out["execution_count"] = count
                out.pop("metadata", None) if out.get("output_type") == "stream" else None
        else:
            cell.outputs = []
            cell.execution_count = None


def main(paths: list[str]) -> int:
    os.environ.update(COURSE_QUICK="1", COURSE_DEVICE="cpu", COURSE_RUN_SOLUTIONS="1")
    os.environ.setdefault("COURSE_RESULTS_DIR", str(Path("build/store-outputs-results").resolve()))
    for p in paths:
        path = Path(p).resolve()
        nb = nbformat.read(path, as_version=4)
        NotebookClient(nb, timeout=1200, kernel_name="python3",
                       resources={"metadata": {"path": str(path.parent)}}).execute()
        strip(nb)
        nbformat.write(nb, path)
        print(f"stored checked outputs of {path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
