"""Run the whole course on an offline GPU node with the Python it already has (`make gpu-check`).

A GPU node typically has torch, torchvision, matplotlib, numpy, pandas and tqdm, but no Jupyter tools and no
package index, and is lent for minutes. This script
1. refuses at once, in one line, when this Python has no torch or the device is missing (no silent CPU run);
2. prints a pre-flight in its first seconds (C compiler and Python.h for torch.compile, /dev/shm, the CPU quota,
   the GPU's compute mode, free disk, notebook tools older than the wheelhouse's pins): one line per problem and
   what the run does about it;
3. installs the notebook tools this Python lacks (papermill, nbclient, ipykernel, ...) from a local wheelhouse
   (`make wheelhouse`) with `pip --no-index` into OUT/site, a scratch folder put first on PYTHONPATH — never
   into the node's Python;
4. extracts a CIFAR-10 tarball into OUT (or uses a folder); without one, the CIFAR lessons are skipped; measures
   the node's ceilings once (peak FLOP/s, bandwidth, cost per operator: helpers.ceilings) for every notebook;
5. runs every notebook (tools/run_course.py, --keep-going) under one deadline: --budget-min covers everything
   from this script's start — pre-flight, install, extraction, notebooks, benchmarks, packing — and the run ends
   by DEADLINE_GRACE_S after it at the latest; each notebook is stopped at its own limit;
6. packs results, executed notebooks, logs, times.json, report.md and the benchmark log into ONE archive,
   OUT/gpu-check-<machine>-<date>.tar.gz, the one file to copy off the node.
Everything it writes — caches of Jupyter, IPython, matplotlib, Triton and inductor, Python's bytecode, temporary
files, work folders — lives under OUT; the repository is left as it was. Two halves of the course (two calls with
ONLY=, into two OUT folders) merge into one report with tools/merge_runs.py.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

sys.dont_write_bytecode = True  # no __pycache__ from this process in the repository (its children write under OUT)
from preflight import dist_key, installed_version, node  # noqa: E402 beside this script; stdlib only

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_TOOLS = ("papermill", "nbclient", "nbformat", "ipykernel", "jupyter_client")
CIFAR_NOTEBOOKS = "04,05,06,07"
DEADLINE_GRACE_S = 45      # the run ends by --budget-min plus at most this (a notebook stopped at the deadline)
BENCH_RESERVE_S = 75       # of the budget, kept for the benchmarks: 71 s on a 2-core Xeon (2026-12-05), with
BENCH_ARGS = {"diagnose_workloads.py": ["--budget-s", "5"]}  # 35 s for its six diagnoses (55 s at its default 10 s)
PACK_RESERVE_S = 10        # of the budget, kept for the report and the archive
PLAN_SETUP_S = 40          # a dry run's guess at the pre-flight, install, extraction, ceilings and warm-up (25-38 s without it, 2 cores)
ARCHIVE_LIMIT_MB = 16


def fail(message: str) -> None:
    print(f"gpu-check: {message}", file=sys.stderr)
    raise SystemExit(2)


def say(message: str) -> None:
    print(f"gpu-check: {message}", flush=True)


def check_device(device: str, allow_cpu: bool) -> str:
    """The device string to run on; exits with one line when torch or the GPU is missing."""
    try:
        import torch
    except ImportError:
        fail(f"{sys.executable} has no torch: run with the Python that has it (make gpu-check PYTHON=...)")
    if device.startswith("cuda") and not torch.cuda.is_available() and not allow_cpu:
        fail("no usable CUDA GPU here (torch.cuda.is_available() is False); this check measures GPUs and does "
             "not fall back to the CPU (ALLOW_CPU=1 with DEVICE=cpu only for testing the path)")
    if device == "cpu" and not allow_cpu:
        fail("DEVICE=cpu measures no GPU: pass ALLOW_CPU=1 if that is really what you want (tests do)")
    return device


def _dist_name(wheel: Path) -> str:
    return dist_key(wheel.name.split("-")[0])


def install_tools(wheelhouse: Path, target: Path, replace: set) -> list[str]:
    """Install the wheels whose distributions this Python lacks (or has older than pinned: ``replace``) into
    ``target``; return their names."""
    missing_tools = [t for t in NOTEBOOK_TOOLS if not installed_version(t)]
    if not missing_tools and not replace:
        return []
    wheels = sorted(wheelhouse.glob("*.whl")) if wheelhouse.is_dir() else []
    if not wheels:
        if missing_tools:
            fail(f"this Python lacks {', '.join(missing_tools)} and {wheelhouse} holds no wheels: run `make wheelhouse` "
                 "on a machine with a package index and bring the folder along")
        return []
    needed = [w for w in wheels if not installed_version(_dist_name(w)) or _dist_name(w) in replace]
    if not needed:
        return []
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


def scratch_env(out: Path, site: Path, threads: int | None) -> dict:
    """The environment of everything the run starts: every cache and scratch folder under ``out``."""
    dirs = {"COURSE_BUILD_DIR": "build", "JUPYTER_RUNTIME_DIR": "jupyter/runtime", "JUPYTER_DATA_DIR": "jupyter/data",
            "JUPYTER_CONFIG_DIR": "jupyter/config", "IPYTHONDIR": "ipython", "MPLCONFIGDIR": "matplotlib",
            "TRITON_CACHE_DIR": "cache/triton", "TORCHINDUCTOR_CACHE_DIR": "cache/inductor",
            "PYTHONPYCACHEPREFIX": "cache/pycache", "XDG_CACHE_HOME": "cache", "TORCH_HOME": "cache/torch",
            "TMPDIR": "tmp"}
    env = dict(os.environ, PYTHONUNBUFFERED="1", JUPYTER_PLATFORM_DIRS="1",
               PYTHONPATH=os.pathsep.join([str(site), str(ROOT)] + (
                   [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
    # With a bytecode prefix Python reads compiled modules only from there; were writing it off (a shell's
    # PYTHONDONTWRITEBYTECODE), every kernel and DDP worker would compile torch again (an import of
    # helpers.distributed and an optimizer: 9.9 s against 3.9 s on 2 cores)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    for name, sub in dirs.items():
        (out / sub).mkdir(parents=True, exist_ok=True)
        env[name] = str(out / sub)
    if threads:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return env


def _parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--wheelhouse", default=str(ROOT / "build" / "wheelhouse"))
    ap.add_argument("--cifar10", default=None)
    ap.add_argument("--budget-min", type=float, default=7.0)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--allow-cpu", action="store_true")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default=None)
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--plan", action="store_true", help="a dry run: print the plan (each notebook's budget and "
                    "limit, the run's end) without installing, extracting or running anything")
    return ap.parse_args(argv)


def course_command(args, device: str, notebook_budget: float, deadline: float, cifar: bool) -> list[str]:
    """The tools/run_course.py command of this run (the dry run prints its plan)."""
    run = [sys.executable, str(ROOT / "tools" / "run_course.py"), "--device", device, "--out",
           str(Path(args.out).resolve()),  # run_course runs in ROOT: a relative OUT must mean the caller's folder
           "--keep-going", "--budget-s", f"{notebook_budget:.0f}",
           "--deadline", f"{deadline - PACK_RESERVE_S - (0 if args.no_bench else 5):.0f}"] + (
        ["--quick"] if args.quick else []) + (["--only", args.only] if args.only else [])
    if not cifar:
        run += ["--skip", CIFAR_NOTEBOOKS, "--skip-reason",
                "skipped: it needs CIFAR-10 and none was given (CIFAR10=folder-or-tarball)"]
    return run


def notebook_share(args, spent_s: float) -> float:
    """Seconds of the budget left to the notebooks once ``spent_s`` is spent (the benchmarks and packing kept)."""
    return 60 * args.budget_min - spent_s - PACK_RESERVE_S - (0 if args.no_bench else BENCH_RESERVE_S)


def plan(args) -> int:
    """The dry run: what the run would give each notebook, assuming PLAN_SETUP_S before the notebooks."""
    t0 = time.time()
    deadline = t0 + 60 * args.budget_min + DEADLINE_GRACE_S
    budget = notebook_share(args, PLAN_SETUP_S)
    say(f"dry run: budget {60 * args.budget_min:.0f} s = about {PLAN_SETUP_S} s before the notebooks (pre-flight, "
        f"install, CIFAR-10, ceilings) + {budget:.0f} s of notebooks + "
        + ("" if args.no_bench else f"{BENCH_RESERVE_S} s of benchmarks + ") + f"{PACK_RESERVE_S} s to pack; "
        f"the run ends by {datetime.datetime.fromtimestamp(deadline):%H:%M:%S} at the latest")
    cmd = course_command(args, args.device, budget, deadline, bool(args.cifar10)) + ["--plan"]
    return subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT))).returncode


def main(argv=None) -> int:
    args = _parse(argv)
    if args.plan:
        return plan(args)
    t0 = time.time()
    deadline = t0 + 60 * args.budget_min + DEADLINE_GRACE_S
    device = check_device(args.device, args.allow_cpu)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    pre = node(out, device)
    (out / "preflight.txt").write_text("\n".join(pre["lines"]) + "\n", encoding="utf-8")
    site = out / "site"
    installed = install_tools(Path(args.wheelhouse), site, set(pre["outdated"]))
    say(f"notebook tools from the wheelhouse: {', '.join(installed) or 'none needed'}")
    env = scratch_env(out, site, pre["threads"])
    if pre["no_workers"]:
        env["COURSE_LOADER_WORKERS"] = "0"
    if pre["no_compile"]:
        env["COURSE_NO_COMPILE"] = "1"
    tree = cifar10_tree(args.cifar10, out / "cifar10")
    measure_ceilings(env, device)
    notebook_budget = notebook_share(args, time.time() - t0)
    run = course_command(args, device, notebook_budget, deadline, tree is not None)
    if tree is not None:
        env["COURSE_CIFAR10_DIR"] = str(tree)
    say(f"{time.time() - t0:.0f} s spent before the notebooks; they get {notebook_budget:.0f} s, the run ends by "
        f"{datetime.datetime.fromtimestamp(deadline):%H:%M:%S} at the latest")
    code = subprocess.run(run, env=env, cwd=ROOT).returncode
    if not args.no_bench:
        code = run_benchmarks(out, env, deadline - PACK_RESERVE_S) or code
    archive = pack(out)
    say(f"done in {time.time() - t0:.0f} s (budget {60 * args.budget_min:.0f} s); results in {out / 'results'}; "
        f"copy this one file off the node: {archive} ({archive.stat().st_size / 2**20:.1f} MB). Promote the "
        f"results with tools/promote_reference.py {out / 'results'}")
    return code


CEILINGS = """
import torch
from helpers.ceilings import measured_ceilings
for device, threads in dict.fromkeys((({device!r}, None), ("cpu", None), ("cpu", 1))):  # a CPU run: cpu once
    torch.set_num_threads(threads or torch.get_num_threads())
    c = measured_ceilings(device)
    print(f"{{device}}, {{torch.get_num_threads()}} thread(s): " + ", ".join(
        f"{{k}} {{v / 1e9:.0f}} GFLOP/s" for k, v in c["flops_per_s"].items())
        + f", {{c['bytes_per_s'] / 1e9:.0f}} GB/s, {{c['op_s'] * 1e6:.1f}} us per operator")
# What every notebook's kernel imports, compiled into the run's fresh bytecode cache (and matplotlib's font cache
# built) here, outside the notebooks' budgets: in the first notebook it took 6-12 s of a 12 s budget.
try:
    import importlib, pkgutil, IPython, ipykernel.kernelapp, matplotlib.pyplot, nbformat, papermill, helpers
    import torch._dynamo, torch._inductor.config, torchvision.transforms.v2  # lessons 04-11
    for module in pkgutil.iter_modules(helpers.__path__):  # every lesson imports a few; importing does no work
        importlib.import_module(f'helpers.{{module.name}}')
except Exception as err:  # noqa: BLE001 - a warm-up, never the reason the ceilings are not measured
    print(f"warm-up: {{type(err).__name__}}: {{err}}")
"""


CEILINGS_TIMEOUT_S = 300


def measure_ceilings(env: dict, device: str) -> None:
    """Measure this node's ceilings once, before the notebooks, into the run's cache (XDG_CACHE_HOME under OUT):
    the device's, and the CPU's with all threads and with one (lessons 01-10 read them for MFU and predictions;
    measured inside a notebook they would eat its budget). Counted in the budget; a failure is reported, not fatal."""
    t0 = time.time()
    try:
        proc = subprocess.run([sys.executable, "-c", CEILINGS.format(device=device)], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=CEILINGS_TIMEOUT_S)
    except subprocess.TimeoutExpired:  # a hung measurement must not end the run without its archive
        say(f"ceilings: stopped after {CEILINGS_TIMEOUT_S} s, not measured (the notebooks will measure them)")
        return
    for line in (proc.stdout + proc.stderr).strip().splitlines()[-4:]:
        say(f"ceilings: {line}")
    say(f"ceilings measured in {time.time() - t0:.0f} s" if proc.returncode == 0 else
        "ceilings: not measured (the notebooks will measure them themselves)")


def run_benchmarks(out: Path, env: dict, deadline: float) -> int:
    """Each benchmarks/*.py in turn, within ``deadline``, its output printed and kept in OUT/benchmarks.txt."""
    code = 0
    with open(out / "benchmarks.txt", "w", encoding="utf-8") as log:
        for bench in sorted((ROOT / "benchmarks").glob("*.py")):
            left = deadline - time.time()
            name = bench.relative_to(ROOT)
            if left < 5:
                said = f"== {name}: skipped, the run's deadline is near"
                print(said, flush=True)
                log.write(said + "\n")
                continue
            print(f"== {name}", flush=True)
            try:
                proc = subprocess.run([sys.executable, str(bench), *BENCH_ARGS.get(bench.name, [])], env=env,
                                      cwd=ROOT, capture_output=True, text=True, timeout=left)
                text, rc = proc.stdout + proc.stderr, proc.returncode
            except subprocess.TimeoutExpired as exc:
                said = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
                text, rc = f"{said}stopped at the run's deadline after {left:.0f} s\n", 1  # (bytes on a timeout)
            print(text, end="", flush=True)
            log.write(f"== {name}\n{text}")
            code = code or rc
    return code


def pack(out: Path) -> Path:
    """One archive of what a person needs from the run (not the caches, the wheels or CIFAR-10)."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", platform.node() or "node")
    archive = out / f"gpu-check-{name}-{datetime.date.today().isoformat()}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for part in ("results", "notebooks", "logs", "times.json", "report.md", "benchmarks.txt", "preflight.txt",
                     "build/traces"):
            if (out / part).exists():
                tar.add(out / part, arcname=part)
    size_mb = archive.stat().st_size / 2**20
    if size_mb > ARCHIVE_LIMIT_MB:
        say(f"warning: the archive is {size_mb:.1f} MB, over {ARCHIVE_LIMIT_MB} MB")
    return archive


if __name__ == "__main__":
    sys.exit(main())
