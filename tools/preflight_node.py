"""The first seconds of `make gpu-check`: what on this node would spoil the run, each with what the run does.

Standard library only (and torch's version, already checked): it runs before the notebook tools are installed.
`node_preflight(out, device)` prints one line per fact or problem and returns what the run adjusts.
"""
from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

PINS = Path(__file__).resolve().parent / "gpu-check-requirements.txt"
MIN_SHM_MB = 1024       # DataLoader workers hand batches over through /dev/shm
MIN_FREE_GB = 2         # executed notebooks, CIFAR-10 extracted (~200 MB), caches


def _version_tuple(text: str) -> tuple:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:4])


def dist_key(name: str) -> str:
    """A distribution's name as pip compares them (``Jupyter-Client`` and ``jupyter_client`` are one)."""
    return re.sub(r"[-_.]+", "_", name.strip()).lower()


def installed_version(name: str) -> str | None:
    """The version of distribution ``name`` this Python has, or None."""
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def pinned() -> dict:
    """``{distribution: version}`` of the wheelhouse's pins (tools/gpu-check-requirements.txt)."""
    pins = {}
    for line in PINS.read_text(encoding="utf-8").splitlines():
        if "==" in line and not line.lstrip().startswith("#"):
            name, version = line.split("==", 1)
            pins[dist_key(name)] = version.strip()
    return pins


def outdated_tools() -> dict:
    """Pinned tools this Python has in an OLDER version than the pin: ``{name: (installed, pinned)}``."""
    found = {}
    for name, version in pinned().items():
        have = installed_version(name)
        if have and _version_tuple(have) < _version_tuple(version):
            found[name] = (have, version)
    return found


def cpu_quota() -> float | None:
    """CPUs the cgroup lets this process use (``cpu.max`` of cgroup v2, or v1's quota/period); None: no limit."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        period = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
        return None if quota <= 0 else quota / period
    except (OSError, ValueError):
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
    if not shutil.which("nvidia-smi"):
        return []
    try:
        run = subprocess.run(["nvidia-smi", "--query-gpu=index,compute_mode", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in run.stdout.splitlines() if line.strip()]


def node_preflight(out: Path, device: str) -> dict:
    """Print the node's facts and problems; return ``{"lines", "threads", "no_workers", "no_compile", "outdated"}``."""
    lines, found = [], {"threads": None, "no_workers": False, "no_compile": False, "outdated": {}}

    def say(text: str) -> None:
        lines.append(text)
        print(f"gpu-check: pre-flight: {text}", flush=True)

    say(f"Python {sys.version.split()[0]} at {sys.executable}")
    problem = compiler_problem()
    if problem:
        found["no_compile"] = True
        say(f"PROBLEM: no {problem}: torch.compile cannot build kernels here, so the compile rows of lessons 08 "
            "and 10 will be missing (the run sets COURSE_NO_COMPILE=1 and goes on)")
    else:
        say("C compiler and Python.h found (torch.compile can build kernels)")
    _shm(say, found)
    _cpus(say, found)
    for mode in compute_modes() if device.startswith("cuda") else []:
        say(f"GPU compute mode {mode}")
        if "exclusive" in mode.lower():
            say("PROBLEM: an exclusive-process GPU holds one CUDA context: the notebook's kernel and a torchrun "
                "child cannot share it, so lesson 05's DDP runs and 09's sharding run will fail (the run goes on)")
    free_gb = shutil.disk_usage(out).free / 2**30
    say(f"free disk under {out}: {free_gb:.1f} GB")
    if free_gb < MIN_FREE_GB:
        say(f"PROBLEM: under {MIN_FREE_GB} GB free: CIFAR-10 and the caches may not fit (the run goes on)")
    found["outdated"] = outdated_tools()
    for name, (have, pin) in found["outdated"].items():
        say(f"PROBLEM: {name} {have} is older than the wheelhouse's {pin}: the run installs {pin} into OUT/site, "
            "which comes first on PYTHONPATH")
    found["lines"] = lines
    return found


def _shm(say, found: dict) -> None:
    try:
        shm_mb = shutil.disk_usage("/dev/shm").total / 2**20
    except OSError:
        return
    say(f"/dev/shm: {shm_mb:.0f} MB")
    if shm_mb < MIN_SHM_MB:
        found["no_workers"] = True
        say(f"PROBLEM: /dev/shm under {MIN_SHM_MB} MB: DataLoader workers hand batches over through it and can die "
            "with a bus error (the run sets COURSE_LOADER_WORKERS=0: batches are made in the main process)")


def _cpus(say, found: dict) -> None:
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = os.cpu_count() or 1
    quota = cpu_quota()
    say(f"CPU cores: {affinity} in the affinity mask, cgroup quota " + (f"{quota:g} CPUs" if quota else "none"))
    if quota and math.ceil(quota) < affinity:
        found["threads"] = max(1, math.ceil(quota))
        say(f"PROBLEM: the quota ({quota:g} CPUs) is below the {affinity} cores PyTorch would use: threads would "
            f"fight for it (the run sets OMP_NUM_THREADS={found['threads']})")
