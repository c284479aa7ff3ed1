"""Run the whole course on an offline GPU node with the Python it already has (`make gpu-check`).

    python3 tools/gpu_check.py --out OUT [--wheelhouse build/wheelhouse] [--cifar10 DIR|TARBALL]
                               [--budget-min 8] [--device cuda] [--allow-cpu] [--quick] [--only 00,01]

A GPU node typically has torch, torchvision, matplotlib, numpy, pandas and tqdm, but no Jupyter tools and no
package index. This script
1. refuses at once, in one line, when this Python has no torch or the device is missing (no silent CPU run);
2. installs the notebook tools that this Python lacks (papermill, nbclient, ipykernel, ...) from a local
   wheelhouse (`make wheelhouse` on a machine with an index) with `pip --no-index` into OUT/site, a scratch
   folder put on PYTHONPATH — never into the site Python;
3. extracts a CIFAR-10 tarball if given (or uses a folder); without one, the CIFAR lessons are skipped with a line;
4. runs every notebook with papermill (tools/run_course.py, --keep-going, each sized by a `budget_s` share of
   --budget-min), then the benchmarks, and leaves everything in OUT.
Only the standard library is imported before the checks, so the errors come in the first seconds.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_TOOLS = ("papermill", "nbclient", "nbformat", "ipykernel", "jupyter_client")
CIFAR_NOTEBOOKS = "04,05,06,07"


def fail(message: str) -> None:
    print(f"gpu-check: {message}", file=sys.stderr)
    raise SystemExit(2)


def check_device(device: str, allow_cpu: bool) -> str:
    """The device string to run on; exits with one line when torch or the GPU is missing."""
    try:
        import torch
    except ImportError:
        fail(f"{sys.executable} has no torch: run with the Python that has it (make gpu-check PYTHON=...)")
    if device.startswith("cuda") and not torch.cuda.is_available():
        if not allow_cpu:
            fail("no usable CUDA GPU here (torch.cuda.is_available() is False); this check measures GPUs and does "
                 "not fall back to the CPU (ALLOW_CPU=1 with DEVICE=cpu only for testing the path)")
    if device == "cpu" and not allow_cpu:
        fail("DEVICE=cpu measures no GPU: pass ALLOW_CPU=1 if that is really what you want (tests do)")
    return device


def _dist_name(wheel: Path) -> str:
    return re.sub(r"[-_.]+", "_", wheel.name.split("-")[0]).lower()


def _installed(name: str) -> bool:
    from importlib import metadata

    try:
        metadata.distribution(name)
        return True
    except metadata.PackageNotFoundError:
        return False


def install_tools(wheelhouse: Path, target: Path) -> list[str]:
    """Install the wheels whose distributions this Python lacks into ``target``; return their names."""
    missing_tools = [t for t in NOTEBOOK_TOOLS if not _installed(t)]
    if not missing_tools:
        return []
    wheels = sorted(wheelhouse.glob("*.whl")) if wheelhouse.is_dir() else []
    if not wheels:
        fail(f"this Python lacks {', '.join(missing_tools)} and {wheelhouse} holds no wheels: run `make wheelhouse` "
             "on a machine with a package index and bring the folder along")
    needed = [w for w in wheels if not _installed(_dist_name(w))]
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--no-compile",
           "--disable-pip-version-check", "--target", str(target), *map(str, needed)]
    if subprocess.run(cmd).returncode != 0:
        fail(f"installing the wheelhouse into {target} failed (pip's message above)")
    return [_dist_name(w) for w in needed]


def cifar10_tree(given: str | None, scratch: Path) -> Path | None:
    """A CIFAR-10 image-folder tree from a folder or a .tar.gz of one (extracted once into ``scratch``)."""
    if not given:
        return None
    path = Path(given).expanduser().resolve()
    if path.is_dir():
        return path
    if not path.is_file() or not tarfile.is_tarfile(path):
        fail(f"CIFAR10={given} is neither a folder nor a tar archive of the image-folder tree")
    done = scratch / ".complete"
    if not done.exists():
        scratch.mkdir(parents=True, exist_ok=True)
        with tarfile.open(path) as tar:
            tar.extractall(scratch, filter="data")
        done.touch()
    inner = scratch / "CIFAR-10-images"
    return inner if inner.is_dir() else scratch


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--wheelhouse", default=str(ROOT / "build" / "wheelhouse"))
    ap.add_argument("--cifar10", default=None)
    ap.add_argument("--budget-min", type=float, default=8.0)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--allow-cpu", action="store_true")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default=None)
    ap.add_argument("--no-bench", action="store_true")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    device = check_device(args.device, args.allow_cpu)
    out = Path(args.out).resolve()
    site = out / "site"
    installed = install_tools(Path(args.wheelhouse), site)
    print(f"gpu-check: notebook tools from the wheelhouse: {', '.join(installed) or 'none needed'}", flush=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(ROOT)] + (
        [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])), PYTHONUNBUFFERED="1")
    tree = cifar10_tree(args.cifar10, ROOT / "build" / "gpu-check-cifar10")
    run = [sys.executable, str(ROOT / "tools" / "run_course.py"), "--device", device, "--out", str(out),
           "--keep-going", "--budget-min", str(args.budget_min)] + (["--quick"] if args.quick else []) + (
        ["--only", args.only] if args.only else [])
    if tree is not None:
        env["COURSE_CIFAR10_DIR"] = str(tree)
    else:
        run += ["--skip", CIFAR_NOTEBOOKS, "--skip-reason",
                "skipped: it needs CIFAR-10 and none was given (CIFAR10=folder-or-tarball)"]
    code = subprocess.run(run, env=env, cwd=ROOT).returncode
    if not args.no_bench:
        code = run_benchmarks(out, env) or code
    print(f"gpu-check: done in {time.perf_counter() - start:.0f} s; results in {out / 'results'} "
          f"(promote them with tools/promote_reference.py {out / 'results'})", flush=True)
    return code


def run_benchmarks(out: Path, env: dict) -> int:
    """Each benchmarks/*.py in turn, its output printed and kept in OUT/benchmarks.txt."""
    code = 0
    with open(out / "benchmarks.txt", "w", encoding="utf-8") as log:
        for bench in sorted((ROOT / "benchmarks").glob("*.py")):
            print(f"== {bench.relative_to(ROOT)}", flush=True)
            proc = subprocess.run([sys.executable, str(bench)], env=env, cwd=ROOT, capture_output=True, text=True)
            print(proc.stdout + proc.stderr, end="", flush=True)
            log.write(f"== {bench.relative_to(ROOT)}\n{proc.stdout}{proc.stderr}")
            code = code or proc.returncode
    return code


if __name__ == "__main__":
    sys.exit(main())
