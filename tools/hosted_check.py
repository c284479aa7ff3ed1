"""Each lesson as a learner opens it on Colab or Kaggle, proven offline on this machine (`make hosted-check`).

A fresh Python that has torch, torchvision, numpy, matplotlib, pandas, tqdm and the Jupyter kernel but not the course
(linked from this Python's copies through a path file, as a hosted runtime has its own); a wheel of this checkout;
each notebook copied alone into an empty folder and run there in quick mode with COURSE_SOURCE set to the wheel, so
that its first cell installs the course. A lesson passes when it runs, writes its results beside itself and its
first cell's pip installs no torch, torchvision or numpy. Nothing is written into the checkout.

    python tools/hosted_check.py [--only 03,05] [--cifar10 DIR] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
RUNTIME = ("torch", "torchvision", "numpy", "matplotlib", "pandas", "tqdm", "ipykernel", "papermill", "pip")
KEPT = ("torch", "torchvision", "numpy")  # what the first cell must never install
WHEEL_FILES = ("pyproject.toml", "README.md", "helpers", "data", "solutions")


def closure(names) -> dict:
    """``{name: distribution}`` of what ``names`` need in this Python: requirements, recursively, with the extras
    a requirement names (torch's ``cuda-toolkit[cudart, ...]``), without the extras nobody asks for."""
    seen, done, todo = {}, set(), [(name, frozenset()) for name in names]
    while todo:
        name, extras = todo.pop()
        dist = metadata.distribution(name)
        key = dist.metadata["Name"].lower().replace("_", "-")
        if (key, extras) in done:
            continue
        done.add((key, extras))
        seen[key] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in ("", *extras)):
                todo.append((req.name, frozenset(req.extras)))
    return seen


def runtime_python(folder: Path, packages=RUNTIME, own_pip: bool = False) -> Path:
    """A new virtual environment in ``folder`` that sees this Python's copies of ``packages`` (and what they
    need) through a path file, and nothing else: a stand-in for a hosted runtime or a GPU node. Without
    ``own_pip`` its pip and setuptools are those of ``packages`` (as on Colab), else the venv's own."""
    venv, shared = folder / "python", folder / "packages"
    subprocess.run([sys.executable, "-m", "venv", *([] if own_pip else ["--without-pip"]), str(venv)], check=True,
                   capture_output=True, timeout=300)
    shared.mkdir()
    dists = closure(packages)
    if "gpu-training-course" in dists:
        raise RuntimeError("the runtime stand-in must not see the course")
    for dist in dists.values():
        for top in {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}:
            src = Path(dist.locate_file(top))
            if src.exists() and not (shared / top).exists():
                (shared / top).symlink_to(src)
    site = next((venv / "lib").glob("python*/site-packages"))
    (site / "runtime-packages.pth").write_text(f"{shared}\n")
    return venv / "bin" / "python"


def build_wheel(folder: Path) -> Path:
    """A wheel of the checkout as it is now (uncommitted changes included), built from a copy, so that the
    build's own folders (build/, *.egg-info) never land in the checkout."""
    src = folder / "source"
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", *WHEEL_FILES], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout.split("\n")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                           "--disable-pip-version-check", "-w", str(folder / "wheels"), str(src)],
                          capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise RuntimeError(f"building the course's wheel failed: {done.stderr.strip()[-1500:]}")
    return next((folder / "wheels").glob("gpu_training_course-*.whl"))


def runtime_env(folder: Path, source: str | None, cifar10: str | None = None) -> dict:
    """A learner's environment: no trace of this checkout (no COURSE_* settings, no PYTHONPATH), no package index
    (``PIP_NO_INDEX``: offline), caches in ``folder``; ``source`` is the course's COURSE_SOURCE. Its processes write
    the bytecode folder it names (Python reads only that one): a shell's PYTHONDONTWRITEBYTECODE is not passed on."""
    dropped = ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COURSE_", "PIP_")) and k not in dropped}
    env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", XDG_CACHE_HOME=str(folder / "cache"),
               MPLCONFIGDIR=str(folder / "matplotlib"), IPYTHONDIR=str(folder / "ipython"),
               JUPYTER_CONFIG_DIR=str(folder / "jupyter"), PYTHONPYCACHEPREFIX=str(folder / "pycache"))
    if source:
        env["COURSE_SOURCE"] = source
    if cifar10:
        env["COURSE_CIFAR10_DIR"] = cifar10
    return env


def installed_line(executed: Path) -> str:
    """What the first cell printed: pip's "Successfully installed ..." line and the source."""
    cells = json.loads(executed.read_text(encoding="utf-8"))["cells"]
    first = next(c for c in cells if c["cell_type"] == "code")
    return "".join("".join(o.get("text", "")) for o in first.get("outputs", [])).strip()


def run_lesson(python: Path, notebook: Path, folder: Path, env: dict, timeout: float = 900) -> dict:
    """Copy ``notebook`` alone into the empty ``folder`` and run it there in quick mode with papermill."""
    folder.mkdir(parents=True)
    shutil.copy2(notebook, folder / notebook.name)
    executed = folder / f"executed-{notebook.name}"
    t0 = time.monotonic()
    done = subprocess.run([str(python), "-m", "papermill", notebook.name, executed.name, "-k", "python3",
                           "-p", "quick", "True", "-p", "device", "cpu", "--no-progress-bar"],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=timeout)
    found = {"notebook": notebook.stem, "seconds": round(time.monotonic() - t0, 1), "ok": done.returncode == 0,
             "results": (folder / "build" / "results" / f"{notebook.stem}.json").is_file(),
             "installed": installed_line(executed) if executed.exists() else "",
             "log": (done.stdout + done.stderr)[-3000:]}
    found["kept"] = not any(f" {name}-" in f" {found['installed']}" for name in KEPT)
    return found


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated notebook numbers, e.g. 03,05")
    ap.add_argument("--cifar10", help="a CIFAR-10 image-folder tree for the lessons that read it")
    ap.add_argument("--out", help="keep everything in this folder (default: a temporary one, removed)")
    args = ap.parse_args(argv)
    wanted = set(args.only.split(",")) if args.only else None
    notebooks = [p for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
                 if wanted is None or p.name[:2] in wanted]
    folder = Path(args.out or tempfile.mkdtemp(prefix="hosted-check-")).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    wheel = build_wheel(folder)
    print(f"hosted-check: each lesson alone in a fresh runtime without the course, under {folder}; the course as "
          f"{wheel.name}", flush=True)
    failed = 0
    for nb in notebooks:
        place = folder / "lessons" / nb.stem
        place.mkdir(parents=True)
        python = runtime_python(place)
        r = run_lesson(python, nb, place / "lesson", runtime_env(place, str(wheel), args.cifar10))
        passed = r["ok"] and r["results"] and r["kept"]
        failed += not passed
        print(f"{nb.stem}: {'ok' if passed else 'FAILED'} in {r['seconds']:.0f} s; first cell: {r['installed']}"
              + ("" if passed else f"\n{r['log']}"), flush=True)
    if not args.out:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"hosted-check: {len(notebooks) - failed} of {len(notebooks)} lesson(s) passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
