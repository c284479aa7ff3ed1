"""Record a notebook's headline measurements as JSON and load committed reference results (notebook 00).

Schema (version 1) of ``build/results/<notebook>.json`` and ``data/reference/<hardware>/<notebook>.json``::

    {"schema": 1, "notebook": str, "quick": bool, "device": str, "timestamp": ISO-8601 str,
     "hardware": helpers.devices.describe(), "results": {...headline figures...}}
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import BinaryIO, Callable

import torch

from .devices import describe

SCHEMA = 1
REQUIRED_KEYS = ("schema", "notebook", "quick", "device", "timestamp", "hardware", "results")


def project_root() -> Path:
    """The course's root folder, found from this file (never from the working directory); once the course is
    installed as a package, the folder that holds ``helpers`` (site-packages: never written to) (notebook 00)."""
    return Path(__file__).resolve().parent.parent


def in_checkout() -> bool:
    """Whether ``helpers`` is imported from a copy of the course's repository (its ``pyproject.toml`` beside it).
    (notebook 00)"""
    return (project_root() / "pyproject.toml").is_file()


def course_file(*parts: str) -> Path:
    """A file the lessons read, named as in the repository (``course_file("data", "gpu_datasheet.json")``).
    (notebook 00)

    In a checkout, the repository's file; once installed, the copy the package ships (``pyproject.toml`` puts
    ``data/`` and ``solutions/`` inside ``helpers``), found with ``importlib.resources``.
    """
    if in_checkout():
        return project_root().joinpath(*parts)
    from importlib.resources import files

    return Path(str(files("helpers").joinpath(*parts)))


def shown_path(path) -> str:
    """``path`` as pages and messages show it: from the course folder when it lies inside it, as ``build/…`` when
    it lies in the run's build folder (``$COURSE_BUILD_DIR``: ``make gpu-check`` puts it outside), else in full:
    the same text on every machine, and the published site names no builder's folders."""
    path = Path(path)
    resolved, build, root = path.resolve(), build_dir().resolve(), project_root()  # relative: from the cwd
    if resolved.is_relative_to(build):
        return str(Path("build") / resolved.relative_to(build))
    return str(resolved.relative_to(root)) if resolved.is_relative_to(root) else str(path)


def build_dir() -> Path:
    """Where runs write (work folders, traces, results): ``$COURSE_BUILD_DIR`` if set, else ``<root>/build`` in a
    checkout, else ``build/`` in the working directory (the notebook's folder on Colab or Kaggle) (notebook 00).

    ``make gpu-check`` points it into its ``OUT`` folder, so a run on a borrowed node leaves the repository as it was.
    """
    env = os.environ.get("COURSE_BUILD_DIR")
    if env:
        return Path(env)
    return project_root() / "build" if in_checkout() else Path.cwd().resolve() / "build"


def cache_dir() -> Path:
    """The user's cache of the course: ``$XDG_CACHE_HOME/gpu-course`` (default ``~/.cache/gpu-course``): measured
    ceilings (notebook 08) and, outside a checkout, CIFAR-10's download. Per user and machine, not per run or per
    checkout; ``make gpu-check`` points ``XDG_CACHE_HOME`` into its output."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "gpu-course"


def results_dir() -> Path:
    """Where results go: ``$COURSE_RESULTS_DIR`` if set, else ``<build>/results`` (notebook 00)."""
    env = os.environ.get("COURSE_RESULTS_DIR")
    return Path(env) if env else build_dir() / "results"


def reference_dir() -> Path:
    """The committed reference results: ``data/reference`` of the checkout, or of the installed package.
    (notebook 00)"""
    return course_file("data", "reference")


def work_dir(notebook: str) -> Path:
    """A scratch folder for this run of ``notebook``: ``<build>/work/<notebook>/run-<pid>`` (notebooks 04, 05).

    Each kernel gets its own folder, so two runs at once (say nbval and ``make run``) never overwrite each
    other's files; folders of runs whose process has ended are removed first.
    """
    base = build_dir() / "work" / notebook
    base.mkdir(parents=True, exist_ok=True)
    for old in base.glob("run-*"):
        pid = old.name.removeprefix("run-")
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    path = base / f"run-{os.getpid()}"
    path.mkdir(exist_ok=True)
    return path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def to_jsonable(value):
    """Turn tensors, numpy numbers, tuples and non-string keys into plain JSON data (NaN becomes null) (notebook 00)."""
    if isinstance(value, torch.Tensor):
        return to_jsonable(value.detach().cpu().tolist())
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return to_jsonable(value.item())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot store a {type(value).__name__} in a results file; convert it to numbers or text")


def atomic_write(path: str | Path, write: Callable[[BinaryIO], object], *, keep_previous: Path | None = None) -> Path:
    """Write a file so that readers never see half of it: temp file beside it, ``write(fh)``, fsync, rename.
    (notebook 00)

    With ``keep_previous``, an existing file is first renamed there (checkpoints keep ``*.prev.pt``). On any
    error the temp file is removed and the old file is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        if keep_previous is not None and path.exists():
            os.replace(path, keep_previous)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """``atomic_write`` for text (UTF-8): results files, reports (notebook 00)."""
    return atomic_write(path, lambda fh: fh.write(text.encode("utf-8")))


def save_results(notebook: str, results: dict, *, quick: bool, device: str, out_dir: str | Path | None = None,
                 hardware: dict | None = None, budget_s: float | None = None, partial: bool = False) -> Path:
    """Write a notebook's headline results with hardware, torch version, quick flag and time (notebook 00).

    ``budget_s``: the time budget the run was sized to (``make gpu-check``), None for a run at its full sizes;
    ``partial``: what a notebook had measured when it last saved before its end (``helpers.course``).
    """
    record = {
        "schema": SCHEMA,
        "notebook": notebook,
        "quick": bool(quick),
        "device": str(device),
        "budget_s": budget_s,
        "partial": bool(partial),
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "hardware": hardware if hardware is not None else describe(),
        "results": to_jsonable(results),
    }
    path = Path(out_dir) if out_dir else results_dir()
    path = path / f"{notebook}.json"
    atomic_write_text(path, json.dumps(record, indent=2) + "\n")
    return path


def pack_results(folder: str | Path | None = None) -> Path:
    """One zip of the results files in ``folder`` (default ``results_dir()``), named after the hardware they were
    measured on, beside that folder: the file a learner downloads from Colab or Kaggle to bring a run home.
    ``tools/promote_reference.py`` accepts it as it is (notebook 00)."""
    folder = Path(folder or results_dir())
    files = sorted(folder.glob("[0-9][0-9]_*.json"))
    if not files:
        raise FileNotFoundError(f"no results files in {folder}: run a lesson to the end first")
    name = load_results(files[-1])["hardware"].get("name", "unknown")
    target = folder.parent / f"results-{name}.zip"

    def write(fh):
        with zipfile.ZipFile(fh, "w", zipfile.ZIP_DEFLATED) as zf:
            for path in files:
                zf.write(path, f"results/{path.name}")
    return atomic_write(target, write)  # never half a zip


def load_results(path: str | Path) -> dict:
    """Read one results file and check it has the schema's keys (notebook 00)."""
    path = Path(path)
    record = json.loads(path.read_text(encoding="utf-8"))
    missing = [k for k in REQUIRED_KEYS if k not in record]
    if missing:
        raise ValueError(f"{path} is not a course results file: missing {', '.join(missing)}")
    return record


def load_reference(notebook: str, root: str | Path | None = None) -> dict[str, dict]:
    """Committed reference results for ``notebook``, keyed by hardware name (empty if none yet) (notebook 00)."""
    base = Path(root) if root else reference_dir()
    found = {}
    for path in sorted(base.glob(f"*/{notebook}.json")):
        found[path.parent.name] = load_results(path)
    return found
