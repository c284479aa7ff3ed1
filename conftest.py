"""pytest set-up shared by the unit tests and nbval: notebooks run in quick mode on the CPU.

CIFAR-10 for tests comes from ../shared/data/cifar10-jpg.tar.gz (never committed), extracted once into
build/cifar10-jpg/ (ignored) and announced to the notebooks through COURSE_CIFAR10_DIR.
"""
import os
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent
CIFAR_TARBALL = ROOT.parent / "shared" / "data" / "cifar10-jpg.tar.gz"
CIFAR_DIR = ROOT / "build" / "cifar10-jpg"


def extract_cifar10():
    """The extracted image-folder tree, or None when the tarball is not on this machine."""
    tree = CIFAR_DIR / "CIFAR-10-images"
    if (tree / "test").is_dir() and (CIFAR_DIR / ".complete").exists():
        return tree
    if not CIFAR_TARBALL.exists():
        return None
    CIFAR_DIR.mkdir(parents=True, exist_ok=True)
    with tarfile.open(CIFAR_TARBALL) as tar:
        tar.extractall(CIFAR_DIR, filter="data")
    (CIFAR_DIR / ".complete").touch()
    return tree


def pytest_configure(config):
    # nbval starts each notebook's kernel with this environment; helpers.course_parameters reads it.
    os.environ["COURSE_QUICK"] = "1"
    os.environ["COURSE_DEVICE"] = "cpu"
    os.environ["COURSE_RUN_SOLUTIONS"] = "1"  # solution cells only show their code to a learner; CI runs them
    os.environ["COURSE_GPUS"] = "all"  # predict for every datasheet GPU: one lacking a dtype must be said, not crash
    os.environ["COURSE_RESULTS_DIR"] = str(ROOT / "build" / "test-results")
    import matplotlib

    matplotlib.use("Agg")  # this process only: the notebooks' kernels keep their inline figures (the site shows them)
    tree = extract_cifar10()
    if tree is not None:
        os.environ.setdefault("COURSE_CIFAR10_DIR", str(tree))


# nbval executes every notebook once; the cells' outputs are kept and each notebook is written, executed, to
# build/test-executed/ when its last cell has run, so the site test builds from this run instead of a second one.
EXECUTED_DIR = ROOT / "build" / "test-executed"
_executed: dict = {}


def pytest_collection_modifyitems(session, config, items):
    """Tests that read the notebooks nbval executed (marked ``executed``) run after nbval, browser tests (marked
    ``browser``) last: the site test reads the executed notebooks too."""
    items.sort(key=lambda item: (item.get_closest_marker("browser") is not None,
                                 item.get_closest_marker("executed") is not None))


def pytest_runtest_teardown(item, nextitem):
    cell = getattr(item, "cell", None)
    if cell is None or not hasattr(item, "test_outputs"):
        return
    path = Path(str(item.parent.fspath))
    _executed.setdefault(path, {})[id(cell)] = item.test_outputs or []
    if nextitem is None or getattr(nextitem, "parent", None) is not item.parent:
        _write_executed(path, item.parent.nb, _executed.pop(path))


def _write_executed(path: Path, nb, outputs: dict) -> None:
    import copy

    import nbformat

    from helpers.results import atomic_write_text

    done = copy.deepcopy(nb)
    count = 0
    for original, cell in zip(nb.cells, done.cells):
        if cell.cell_type != "code":
            continue
        count += 1
        cell.execution_count = count
        cell.outputs = [_as_output(o, count) for o in outputs.get(id(original), [])
                        if not (o.get("output_type") == "execute_result" and _value_hidden(cell.source))]
    done.metadata["course_run"] = {"runner": "nbval (make test)", "quick": True, "device": "cpu"}
    EXECUTED_DIR.mkdir(parents=True, exist_ok=True)
    atomic_write_text(EXECUTED_DIR / path.name, nbformat.writes(done))


def _value_hidden(source: str) -> bool:
    """IPython shows no value for a cell whose last line ends with ';' (``show_source(f);``); nbval still reports
    one, which the site would print as a one-line repr thousands of pixels wide."""
    lines = [line for line in source.rstrip().splitlines() if line.strip()]
    return bool(lines) and lines[-1].split("#")[0].rstrip().endswith(";")


def _as_output(out, count: int):
    import nbformat

    kind = out.get("output_type")
    if kind == "stream":
        return nbformat.v4.new_output("stream", name=out["name"], text=out["text"])
    if kind == "error":
        return nbformat.v4.new_output("error", ename=out["ename"], evalue=out["evalue"], traceback=out["traceback"])
    data, meta = dict(out.get("data", {})), dict(out.get("metadata", {}))
    if kind == "execute_result":
        return nbformat.v4.new_output("execute_result", data=data, metadata=meta, execution_count=count)
    return nbformat.v4.new_output("display_data", data=data, metadata=meta)


def executed_notebooks(prefixes=None) -> tuple[Path, Path]:
    """``(executed notebooks, their results)`` of this run's nbval (build/test-executed/, build/test-results/); when
    a test file runs alone and some are missing or older than their source, those notebooks (``prefixes``: their
    two-digit numbers, default all) are run here once, quick, on the CPU (tools/run_course.py)."""
    import subprocess
    import sys

    sources = [nb for nb in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
               if prefixes is None or nb.name[:2] in prefixes]
    results = ROOT / "build" / "test-results"
    if all((EXECUTED_DIR / nb.name).exists() and (EXECUTED_DIR / nb.name).stat().st_mtime >= nb.stat().st_mtime
           and (results / f"{nb.stem}.json").exists() for nb in sources):
        return EXECUTED_DIR, results
    out = ROOT / "build" / "executed-test-run"
    subprocess.run([sys.executable, str(ROOT / "tools" / "run_course.py"), "--quick", "--device", "cpu", "--out",
                    str(out)] + (["--only", ",".join(sorted(prefixes))] if prefixes else []), check=True)
    return out / "notebooks", out / "results"


def import_tool(name: str):
    """A script of tools/ as a module (tools/ is no package: its scripts import each other by name)."""
    import importlib

    sys.path.insert(0, str(ROOT / "tools"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "tools"))


def checkout_files() -> dict:
    """Every file of the checkout (ignored ones and .venv included, .git not) with its size and mtime: taken before
    and after a run that must write nothing into the checkout (gpu-check, a hosted lesson)."""
    import contextlib

    found = {}
    for folder, dirs, files in os.walk(ROOT):
        if Path(folder) == ROOT:
            dirs[:] = [d for d in dirs if d != ".git"]
        for f in files:
            path = os.path.join(folder, f)
            with contextlib.suppress(OSError):
                st = os.lstat(path)
                found[os.path.relpath(path, ROOT)] = (st.st_size, st.st_mtime_ns)
    return found

