"""Pre-flight checks: is this machine ready for the course (`make check`), and what on a GPU node would spoil
`make gpu-check` (its node section, ``node()``, which tools/gpu_check.py calls first)?

Prints and writes a Markdown report: Python, torch and CUDA versions; each GPU (name, memory, a timed matmul,
bf16 support) and the CPU's matmul; a 2-process all-reduce through torchrun (nccl on 2+ GPUs, gloo otherwise);
JupyterLab and the course kernel; CIFAR-10 present (or its download reachable); Japanese Vowels' checksums; free
disk. Then one line per problem with its fix. Exit status 1 if any problem blocks the course, else 0.
Takes well under 2 minutes (the all-reduce starts two Python processes). Module level is standard library only.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BLOCKS, WARNS = "blocks", "warning"
MIN_FREE_GB = 5  # executed notebooks, checkpoints and CIFAR-10 (~200 MB) fit easily in this


class Report:
    """Facts and problems as they are found; ``prefix`` (gpu-check's node section) prints each one at once."""

    def __init__(self, prefix: str | None = None):
        self.lines, self.problems, self.printed, self.prefix = [], [], [], prefix

    def _print(self, text: str) -> None:
        self.printed.append(text)
        print(f"{self.prefix}{text}", flush=True)

    def fact(self, name: str, value: str) -> None:
        self.lines.append(f"| {name} | {value} |")
        self._print(f"{name}: {value}") if self.prefix else print(f"  {name:<28} {value}", flush=True)

    def problem(self, level: str, what: str, fix: str) -> None:
        self.problems.append((level, what, fix))
        if self.prefix:
            self._print(f"PROBLEM: {what} ({fix})")

    def markdown(self) -> str:
        out = ["# Pre-flight check", "", "| check | result |", "|---|---|", *self.lines, ""]
        if not self.problems:
            return "\n".join(out + ["No problems: this machine is ready for the course.", ""])
        out += ["## Problems", ""]
        out += [f"- **{level}**: {what} — fix: {fix}" for level, what, fix in self.problems]
        return "\n".join(out + [""])


def check_torch(r: Report) -> None:
    import torch

    from helpers.devices import cpu_bf16_native, half_precision, nvidia_driver, usable_cpus
    from helpers.operations import matmul_rate

    def tflops(device, dtype, n: int = 2048) -> float:  # lesson 08's timed matmul, in TFLOP/s
        return matmul_rate(n, device, dtype)["gflops"] / 1e3

    r.fact("Python", sys.version.split()[0])
    r.fact("torch", f"{torch.__version__} (CUDA build {torch.version.cuda or 'none'})")
    r.fact("CPU", f"{usable_cpus()} usable cores, bf16 instructions: {'yes' if cpu_bf16_native() else 'no'}, "
                  f"fp32 matmul {tflops('cpu', torch.float32, n=1024) * 1e3:.0f} GFLOP/s")
    if not torch.cuda.is_available():
        r.fact("GPUs", "none (CUDA not available): the course runs on the CPU; GPU lessons show reference results")
        return
    r.fact("NVIDIA driver", str(nvidia_driver()))
    for i in range(torch.cuda.device_count()):
        dev = torch.device("cuda", i)
        p = torch.cuda.get_device_properties(i)
        try:
            fp32 = tflops(dev, torch.float32)
            bf16 = tflops(dev, torch.bfloat16) if half_precision(dev) is torch.bfloat16 else None
        except RuntimeError as exc:
            r.problem(BLOCKS, f"GPU {i} ({p.name}) failed a matmul: {str(exc)[:100]}",
                      "check `nvidia-smi`; another job may hold the GPU, or the driver is older than torch's CUDA")
            continue
        r.fact(f"GPU {i}", f"{p.name}, {p.total_memory / 2**30:.0f} GiB, fp32 matmul {fp32:.1f} TFLOP/s, bf16 "
                           + (f"{bf16:.1f} TFLOP/s" if bf16 else "not native (AMP uses fp16)"))


def check_allreduce(r: Report) -> None:
    import torch

    backend = "nccl" if torch.cuda.device_count() >= 2 else "gloo"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(Path(__file__).resolve()), "--allreduce-worker", backend]
    t0 = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=90, cwd=ROOT)
    except subprocess.TimeoutExpired:
        r.problem(BLOCKS, f"2-process all-reduce ({backend}) did not finish in 90 s",
                  "a firewall or a busy port blocks the rendezvous: try again, or set MASTER_PORT to a free port")
        return
    ok = done.returncode == 0 and "allreduce ok" in done.stdout
    r.fact("torchrun all-reduce", f"{backend}, 2 processes: {'ok' if ok else 'FAILED'} "
                                  f"({time.perf_counter() - t0:.1f} s with start-up)")
    if not ok:
        r.problem(BLOCKS, f"torchrun all-reduce with {backend} failed: {(done.stderr or done.stdout)[-200:]!r}",
                  "lesson 05 needs it: check that `python -m torch.distributed.run --help` works and localhost resolves")


def allreduce_worker(backend: str) -> None:
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(backend)
    x = torch.full((4,), float(rank + 1), device=device)
    dist.all_reduce(x)
    assert x.tolist() == [3.0] * 4, x
    dist.destroy_process_group()
    if rank == 0:
        print("allreduce ok")


def check_jupyter(r: Report) -> None:
    missing = [m for m in ("jupyterlab", "ipykernel", "papermill") if importlib.util.find_spec(m) is None]
    if missing:
        r.fact("JupyterLab", f"missing: {', '.join(missing)}")
        r.problem(BLOCKS, f"{', '.join(missing)} not importable in {sys.executable}",
                  "run `make lab` (it installs them into .venv), or `pip install -e .[dev]`")
        return
    from jupyter_client.kernelspec import KernelSpecManager

    specs = KernelSpecManager().find_kernel_specs()
    r.fact("JupyterLab", f"importable; kernels: {', '.join(sorted(specs)) or 'none'}")
    if "python3" not in specs:
        r.problem(BLOCKS, "no `python3` Jupyter kernel", "`python -m ipykernel install --user --name python3`")


def check_cifar10(r: Report, network: bool) -> None:
    given = os.environ.get("COURSE_CIFAR10_DIR")
    base = Path(given) if given else ROOT / "data" / "cifar10"
    tree = [p for p in (base, base / "CIFAR-10-images") if (p / "train").is_dir() and (p / "test").is_dir()]
    if tree or (base / "cifar-10-batches-py").is_dir():
        r.fact("CIFAR-10", f"present in {tree[0] if tree else base}")
        return
    if given:
        r.fact("CIFAR-10", f"COURSE_CIFAR10_DIR={given} holds no CIFAR-10")
        r.problem(BLOCKS, f"COURSE_CIFAR10_DIR={given} has no train/<class>/ and test/<class>/ folders",
                  "point it at the extracted image-folder tree (the folder holding train/ and test/)")
        return
    reachable = network and _reachable("www.cs.toronto.edu", 443)
    r.fact("CIFAR-10", "not on this machine; " + ("download reachable (lessons 04-07 fetch it, 170 MB)" if
                                                   reachable else "download NOT reachable"))
    if not reachable:
        r.problem(WARNS, "CIFAR-10 is not here and cannot be downloaded: lessons 04-07 fall back to a synthetic "
                         "stand-in in quick mode and stop in full mode",
                  "copy an image-folder tree here and set COURSE_CIFAR10_DIR (docs/instructors.md: offline room)")


def _reachable(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=3).close()
        return True
    except OSError:
        return False


def check_vowels(r: Report, data_dir: Path) -> None:
    sums = data_dir / "SHA256SUMS"
    bad = []
    for line in sums.read_text().splitlines():
        digest, name = line.split()
        path = data_dir / name
        if not path.exists() or hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            bad.append(name)
    r.fact("Japanese Vowels", "checksums ok" if not bad else f"BAD: {', '.join(bad)}")
    if bad:
        r.problem(BLOCKS, f"{', '.join(bad)} missing or changed in {data_dir} (SHA-256 differs from SHA256SUMS)",
                  f"restore the shipped files: `git checkout -- {data_dir.relative_to(ROOT) if data_dir.is_relative_to(ROOT) else data_dir}`")


def check_disk(r: Report, where: Path = ROOT, min_gb: float = MIN_FREE_GB,
               fix: str = "free some disk, or `make clean` to remove old build/ outputs") -> None:
    free = shutil.disk_usage(where).free / 2**30
    r.fact("free disk", f"{free:.1f} GiB at {where}")
    if free < min_gb:
        r.problem(BLOCKS, f"only {free:.1f} GiB free (the course wants {min_gb} GiB: executed notebooks, "
                          "checkpoints, CIFAR-10)", fix)


# --- the node section: the first seconds of `make gpu-check` (standard library only: it runs before the notebook
# tools are installed). It prints one line per fact or problem and returns what the run adjusts.

PINS = Path(__file__).resolve().parent / "gpu-check-requirements.txt"
MIN_SHM_MB = 1024       # DataLoader workers hand batches over through /dev/shm
NODE_MIN_FREE_GB = 2    # executed notebooks, CIFAR-10 extracted (~200 MB), caches


def dist_key(name: str) -> str:
    """A distribution's name as pip compares them (``Jupyter-Client`` and ``jupyter_client`` are one)."""
    return re.sub(r"[-_.]+", "_", name.strip()).lower()


def installed_version(name: str) -> str | None:
    """The version of distribution ``name`` this Python has, or None."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def pinned() -> dict:
    """``{distribution: version}`` of the wheelhouse's pins (tools/gpu-check-requirements.txt)."""
    lines = PINS.read_text(encoding="utf-8").splitlines()
    return {dist_key(n): v.strip() for n, v in (l.split("==", 1) for l in lines
                                                 if "==" in l and not l.lstrip().startswith("#"))}


def outdated_tools() -> dict:
    """Pinned tools this Python has in an OLDER version than the pin: ``{name: (installed, pinned)}``."""
    numbers = lambda text: tuple(int(p) for p in re.findall(r"\d+", text)[:4])  # noqa: E731
    have = {name: installed_version(name) for name in pinned()}
    return {n: (have[n], v) for n, v in pinned().items() if have[n] and numbers(have[n]) < numbers(v)}


def cpu_quota() -> float | None:
    """CPUs the cgroup lets this process use (``cpu.max`` of cgroup v2, or v1's quota/period); None: no limit."""
    for files in (["cpu.max"], ["cpu/cpu.cfs_quota_us", "cpu/cpu.cfs_period_us"]):
        try:
            quota, period = " ".join(Path("/sys/fs/cgroup", f).read_text() for f in files).split()[:2]
            return None if quota == "max" or int(quota) <= 0 else int(quota) / int(period)
        except (OSError, ValueError):
            continue
    return None


def compiler_problem() -> str | None:
    """Why inductor (torch.compile) cannot build kernels here, or None: it needs a C compiler and Python.h."""
    cc = os.environ.get("CC") or next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)
    header = Path(sysconfig.get_paths()["include"]) / "Python.h"
    missing = ([] if cc and shutil.which(cc.split()[0]) else ["a C compiler (cc/gcc/clang)"]) + (
        [] if header.exists() else [f"Python.h ({header})"])
    return " and ".join(missing) if missing else None


def compute_modes() -> list:
    """Each GPU's compute mode from nvidia-smi (empty without it)."""
    try:
        run = subprocess.run(["nvidia-smi", "--query-gpu=index,compute_mode", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in run.stdout.splitlines() if line.strip()]


def node(out: Path, device: str) -> dict:
    """Print the node's facts and problems; return ``{"lines", "threads", "no_workers", "no_compile", "outdated"}``."""
    r, found = Report("gpu-check: pre-flight: "), {"threads": None, "no_workers": False, "no_compile": False}
    r.fact("Python", f"{sys.version.split()[0]} at {sys.executable}")
    found["no_compile"] = bool(compiler_problem())
    r.fact("C compiler and Python.h", f"missing {compiler_problem()}" if found["no_compile"] else "found")
    if found["no_compile"]:
        r.problem(WARNS, "torch.compile cannot build kernels here: the compile rows of lessons 08 and 10 will be "
                         "missing", "the run sets COURSE_NO_COMPILE=1 and goes on")
    try:
        shm_mb = shutil.disk_usage("/dev/shm").total / 2**20
    except OSError:  # no /dev/shm (macOS) or not readable
        shm_mb = None
    r.fact("/dev/shm", f"{shm_mb:.0f} MB" if shm_mb is not None else "none")
    if shm_mb is not None and shm_mb < MIN_SHM_MB:
        found["no_workers"] = True
        r.problem(WARNS, f"/dev/shm under {MIN_SHM_MB} MB: DataLoader workers hand batches over through it and "
                         "can die with a bus error", "the run sets COURSE_LOADER_WORKERS=0")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = cpu_quota()
    r.fact("CPU cores", f"{cores} in the affinity mask, cgroup quota " + (f"{quota:g} CPUs" if quota else "none"))
    if quota and math.ceil(quota) < cores:
        found["threads"] = max(1, math.ceil(quota))
        r.problem(WARNS, f"the quota ({quota:g} CPUs) is below the {cores} cores PyTorch would use: threads would "
                         "fight for it", f"the run sets OMP_NUM_THREADS={found['threads']}")
    for mode in compute_modes() if device.startswith("cuda") else []:
        r.fact("GPU compute mode", mode)
        if "exclusive" in mode.lower():
            r.problem(WARNS, "an exclusive-process GPU holds one CUDA context: the notebook's kernel and a torchrun "
                             "child cannot share it, so lesson 05's DDP runs and 09's sharding run will fail",
                      "set the GPU's compute mode to Default (the run goes on)")
    check_disk(r, out, NODE_MIN_FREE_GB, "free some disk there, or give OUT another folder (the run goes on)")
    found["outdated"] = outdated_tools()
    for name, (have, pin) in found["outdated"].items():
        r.problem(WARNS, f"{name} {have} is older than the wheelhouse's {pin}",
                  f"the run installs {pin} into OUT/site, which comes first on PYTHONPATH")
    return dict(found, lines=r.printed)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "build" / "preflight.md"))
    ap.add_argument("--data-dir", default=str(ROOT / "data"), help="where Japanese Vowels and SHA256SUMS are")
    ap.add_argument("--no-network", action="store_true", help="do not probe CIFAR-10's download site")
    ap.add_argument("--allreduce-worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.allreduce_worker:
        allreduce_worker(args.allreduce_worker)
        return 0
    t0, r = time.perf_counter(), Report()
    print("Pre-flight check of this machine for the course:")
    for check in (check_torch, check_allreduce, check_jupyter):
        check(r)
    check_cifar10(r, network=not args.no_network)
    check_vowels(r, Path(args.data_dir).resolve())
    check_disk(r)
    from helpers.results import atomic_write_text

    out = atomic_write_text(Path(args.out), r.markdown())
    for level, what, fix in r.problems:
        print(f"{level.upper()}: {what} — fix: {fix}")
    blocking = [p for p in r.problems if p[0] == BLOCKS]
    print(f"{'NOT READY' if blocking else 'ready'}: {len(r.problems)} problem(s), {len(blocking)} blocking; "
          f"{time.perf_counter() - t0:.0f} s; report: {out}")
    return 1 if blocking else 0


if __name__ == "__main__":
    sys.exit(main())
