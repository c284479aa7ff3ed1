"""What the hardware can do: measured and published ceilings, and MFU (taught in notebook 08; notebooks 01-06 and
11 use them): ``measured_ceilings`` on this machine, ``datasheet`` for the GPUs a learner may meet, ``mfu``.
"""
from __future__ import annotations

import functools
import json
import os
import re
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from .devices import describe, float32_precision, half_precision, hardware_name, pick_device, usable_cpus
from .operations import copy_bandwidth, matmul_rate, overhead_rate
from .results import atomic_write_text, cache_dir, course_file
from .transfer import pcie_theoretical

SCHEMA = 1
MIB = 2**20
# Square matmul sizes searched per device type, and the dtypes measured (a "maximum achievable matmul" search:
# the best of several sizes, since one size can miss the tiling a library does best).
MATMUL_SIZES = {"cpu": (512, 1024, 2048), "cuda": (4096, 6144, 8192), "mps": (2048, 3072, 4096)}
# torch.cuda.get_device_name() patterns for the datasheet's entries (first match wins).
DEVICE_NAMES = ((r"H100.*PCIe", "H100 PCIe"), (r"H100", "H100 SXM"), (r"H200", "H200 SXM"),
                (r"A100.*80", "A100 80GB SXM"), (r"\bL4\b", "L4"), (r"\bT4\b", "T4"), (r"RTX 4090", "GeForce RTX 4090"))
MATMUL_DTYPES = {"cpu": ("float32", "bfloat16"), "cuda": ("float32", "tf32", "bfloat16", "float16"),
                 "mps": ("float32", "float16", "bfloat16")}


def ceilings_key(device: torch.device) -> str:
    """The cache key of ``device``'s ceilings: hardware name, device, torch version and CPU threads (notebook 08)."""
    text = f"{hardware_name()}-{device}-torch{torch.__version__}-{torch.get_num_threads()}threads"
    return re.sub(r"[^A-Za-z0-9.+-]+", "-", text)


def last_level_cache_bytes(device: torch.device) -> int:
    """The largest cache in front of ``device``'s memory: a CUDA GPU's L2, the CPU's last-level cache (Linux), else
    64 MiB (notebook 08)."""
    if device.type == "cuda":
        return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 64 * MIB))
    sizes = []
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size") if device.type == "cpu" else ():
        m = re.fullmatch(r"(\d+)([KMG]?)", f.read_text().strip())
        if m:
            sizes.append(int(m[1]) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[m[2]])
    return max(sizes, default=64 * MIB)


def copy_elements(device: torch.device) -> int:
    """fp32 values per array of the bandwidth copy: each array twice the largest cache and at least 256 MiB, so
    source and destination together are at least four times the cache (at most an eighth of free memory).
    (notebook 08)"""
    nbytes = max(256 * MIB, 2 * last_level_cache_bytes(device))
    if device.type == "cuda":
        nbytes = min(nbytes, torch.cuda.mem_get_info(device)[0] // 8)
    elif hasattr(os, "sysconf") and "SC_AVPHYS_PAGES" in os.sysconf_names:
        nbytes = min(nbytes, os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 8)
    return nbytes // 4


def matmul_peak(device, dtypes=None, sizes=None, min_run_time: float = 0.1) -> dict:
    """The best matmul FLOP/s per dtype over several square sizes, with every size's rate (notebook 08).

    Uses ``helpers.operations.matmul_rate``. ``"tf32"`` is fp32 inputs with TF32 tensor cores allowed, ``"float32"``
    true fp32 (``helpers.devices.float32_precision``); a dtype the device cannot multiply is skipped. A half
    precision the device only emulates (bf16 on a CPU without bf16 instructions: about 1 GFLOP/s on a 2-core AMD
    EPYC, 100 times slower than its fp32; bf16 below compute capability 8.0) is timed at the smallest size alone and
    marked ``"emulated"``: at the largest, one product takes seconds.
    """
    device = torch.device(device)
    best, points = {}, []
    for name in dtypes or MATMUL_DTYPES.get(device.type, ("float32",)):
        dtype = torch.float32 if name == "tf32" else getattr(torch, name)
        emulated = dtype == torch.bfloat16 and device.type != "mps" and half_precision(device) != torch.bfloat16
        all_sizes = sizes or MATMUL_SIZES.get(device.type, (1024,))
        with float32_precision("tf32" if name == "tf32" else "ieee"):
            for n in all_sizes[:1] if emulated else all_sizes:
                try:
                    rate = matmul_rate(n, device, dtype=dtype, min_run_time=min_run_time)["gflops"] * 1e9
                except (RuntimeError, TypeError) as err:  # a dtype this device has no matmul for
                    points.append({"dtype": name, "n": n, "error": str(err).splitlines()[0][:120]})
                    break
                points.append({"dtype": name, "n": n, "flops_per_s": rate, **({"emulated": True} if emulated else {})})
                best[name] = max(best.get(name, 0.0), rate)
    return {"flops_per_s": best, "matmul": points}


def _measure(device: torch.device, min_run_time: float) -> dict:
    t0 = time.perf_counter()
    found = matmul_peak(device, min_run_time=min_run_time)
    n = copy_elements(device)
    copy = copy_bandwidth(n, device, min_run_time=min_run_time)
    tiny = overhead_rate(device, min_run_time=min_run_time)
    return {**found, "bytes_per_s": copy["gbps"] * 1e9, "copy_bytes": 2 * n * 4, "op_s": tiny["us_per_op"] * 1e-6,
            "launch_s": 0.0, "overlap": device.type in ("cuda", "mps"), "seconds_to_measure": time.perf_counter() - t0}


def measured_ceilings(device="auto", *, refresh: bool = False, min_run_time: float = 0.1,
                      measure: bool = True) -> dict | None:
    """This machine's measured ceilings for ``device``, measured once and then read from the cache (notebook 08).

    ``flops_per_s``: best matmul rate per dtype (``matmul_peak``); ``bytes_per_s``: a copy far larger than the
    caches (``helpers.operations.copy_bandwidth``, read + write counted); ``op_s``: seconds per tiny operator
    (``helpers.operations.overhead_rate``: Python, dispatch and, on a GPU, the launch, as the host issues them);
    ``launch_s``: 0 here (``op_s`` timed on the device in use includes the launch); ``overlap``: whether the host
    runs ahead of the device (a GPU) or does the work itself (a CPU). Cached under ``cache_dir()`` by
    ``ceilings_key``; ``refresh=True`` measures again; ``measure=False`` returns None rather than measure (one DDP
    rank of several). Never adjusted to make a prediction agree. The load average is recorded: ceilings measured
    while more programs ran than there are CPUs are low, so they are measured again once the load is below that.
    """
    device, load = pick_device(device), os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    path = cache_dir() / "ceilings" / f"{ceilings_key(device)}.json"
    if path.exists() and not refresh:
        found = json.loads(path.read_text())
        again = measure and (found.get("load_average") or 0) > found.get("cpus", 1) > (1e9 if load is None else load)
        if found.get("schema") == SCHEMA and not again:  # measured on a busy machine, now quieter: measure again
            return {**found, "cache": str(path), "cached": True}
    if not measure:
        return None
    found = {"schema": SCHEMA, "key": ceilings_key(device), "device": str(device), "hardware": describe()["name"],
             "torch": torch.__version__, "threads": torch.get_num_threads(),
             "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
             "load_average": load, "cpus": usable_cpus(), **_measure(device, min_run_time)}
    atomic_write_text(path, json.dumps(found, indent=1))  # two kernels measuring at once never leave half a file
    return {**found, "cache": str(path), "cached": False}


def datasheet_path() -> Path:
    """``data/gpu_datasheet.json`` in the course's folder (notebook 08)."""
    return course_file("data", "gpu_datasheet.json")


@functools.lru_cache(maxsize=4)
def _datasheet_file(path: str) -> dict:
    """The parsed datasheet file, read once per process (every prediction consults it; nothing may modify it)."""
    return json.loads(Path(path).read_text())


def datasheet(path: str | Path | None = None) -> dict:
    """The GPU datasheet: ``{gpu name: entry}``; each entry's numbers carry their source (notebook 08).

    An entry has ``flops_per_s`` (``{dtype: {"value", "source", "quote", ...}}``, dense peaks only, FP32 and TF32
    as separate rows), ``bytes_per_s`` and ``host_link`` (each ``{"value", "source", "quote", ...}``) and
    ``sources`` (``{id: {"title", "url"}}``). A number not found in a source is left out, with a note.
    """
    return _datasheet_file(str(path or datasheet_path()))["gpus"]


def launch_cost(path: str | Path | None = None) -> dict:
    """The host's cost of one CUDA kernel launch, from the datasheet file: ``{"value" (s), "quote", "url", ...}``.

    The lower end of the range its source quotes, so an overhead-bound prediction is a lower bound (notebook 08).
    """
    data = _datasheet_file(str(path or datasheet_path()))
    row = dict(data["launch_s"])
    return {**row, "url": data["sources"][row["source"]]["url"]}


def datasheet_ceilings(entry: dict, *, op_s: float, launch_s: float | None = None) -> dict:
    """Ceilings in ``measured_ceilings``' form from one datasheet entry, for ``predict_step`` (notebook 08).

    The host's ``op_s`` is the learner's own (the same Python dispatches for a GPU); ``launch_s`` the host's cost of
    one kernel launch on top of it (default: ``launch_cost()``, a cited figure). A GPU runs asynchronously, so
    ``overlap`` is True. A PCIe host link of known
    generation and width gives ``h2d_bytes_per_s``: its theoretical one-direction rate
    (``helpers.transfer.pcie_theoretical``). An entry without a published peak (Apple) raises ``ValueError``.
    """
    rates = {dtype: row["value"] for dtype, row in entry["flops_per_s"].items()}
    if not rates:
        raise ValueError(f"no published peak FLOP/s: {entry.get('missing', {}).get('flops_per_s', '')}")
    link = entry.get("host_link", {})
    launch_s = launch_cost()["value"] if launch_s is None else launch_s
    found = {"flops_per_s": rates, "bytes_per_s": entry["bytes_per_s"]["value"], "op_s": op_s,
             "launch_s": launch_s, "overlap": True}
    if link.get("kind") == "PCIe" and link.get("generation") and link.get("lanes"):
        found["h2d_bytes_per_s"] = pcie_theoretical(link["generation"], link["lanes"])["gbps"] * 1e9
    return found


def dtype_peak(rates: dict, dtype: str) -> float:
    """The peak for an operator's dtype, else the fp32 one; a dtype with neither is an error, not a guess
    (notebook 08)."""
    peak = rates.get(dtype) or rates.get("float32")
    if not peak:
        raise ValueError(f"the ceilings have no peak for {dtype} (nor float32): {sorted(rates)}")
    return peak


def datasheet_name(device) -> str | None:
    """The datasheet entry of a CUDA ``device`` (``torch.cuda.get_device_name``), or None (notebook 08)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((entry for pattern, entry in DEVICE_NAMES if re.search(pattern, name)), None)


def main_dtype(work) -> str:
    """The dtype that does most of ``work``'s FLOPs (``float32`` when none are counted) (notebook 08)."""
    work = work.state_dict() if hasattr(work, "state_dict") else work
    flops: dict[str, int] = {}
    for row in work["rows"]:
        flops[row["dtype"]] = flops.get(row["dtype"], 0) + row["flops"] * row["calls"]
    return max(flops, key=flops.get) if any(flops.values()) else "float32"


def mfu(flops_per_s: float, device="cpu", dtype: str = "float32", *, ceilings: dict | None = None) -> dict:
    """Model FLOPs utilisation: achieved FLOP/s over the measured matmul peak of ``device`` for ``dtype``, and over
    the datasheet's dense peak where the device is a GPU the datasheet knows (notebooks 05-10).

    ``flops_per_s`` counts the model's FLOPs (``count_step``) per second of training. The measured peak is the
    best a large matmul reached here (``measured_ceilings``); a dtype without one falls back to the fp32 peak.
    """
    ceilings = ceilings or measured_ceilings(device)
    peak = dtype_peak(ceilings["flops_per_s"], dtype)
    found = {"flops_per_s": flops_per_s, "dtype": dtype, "peak_flops_per_s": peak, "mfu": flops_per_s / peak,
             "peak": f"measured matmul peak of {ceilings.get('hardware', device)} ({ceilings.get('device', device)})"}
    name = datasheet_name(ceilings.get("device", device))
    rates = datasheet()[name]["flops_per_s"] if name else {}
    if name and (dtype in rates or "float32" in rates):
        sheet_peak = rates.get(dtype, rates.get("float32"))["value"]
        found.update(datasheet_gpu=name, datasheet_peak_flops_per_s=sheet_peak, datasheet_mfu=flops_per_s / sheet_peak)
    return found


def ceiling_fractions(achieved_gflops: dict, ceiling_gflops: float, *, precision: str = "fp32") -> dict:
    """Each achieved rate as a fraction of a measured ceiling of the *same* precision (notebook 02).

    ``achieved_gflops`` maps a label to GFLOP/s, ``ceiling_gflops`` is the best rate measured for ``precision``.
    A fraction above 1 is returned as it is: ``above_ceiling`` says why it can happen.
    """
    if ceiling_gflops <= 0:
        raise ValueError(f"the {precision} ceiling must be a positive rate, not {ceiling_gflops}")
    return {label: rate / ceiling_gflops for label, rate in achieved_gflops.items()}


def above_ceiling(fractions: dict, *, precision: str = "fp32") -> list[str]:
    """One line for each fraction of ``ceiling_fractions`` above 1, with its two likely causes (notebook 02;
    Winograd convolutions: Lavin & Gray, 2016; precision: ``helpers.devices.float32_precision``)."""
    return [f"{label}: {f:.0%} of the {precision} matmul ceiling. Above 100 % means one of two things: the library "
            "chose an algorithm that does fewer arithmetic operations than the direct count this rate divides "
            "(Winograd or FFT convolutions in cuDNN), or the work and the ceiling ran in different precisions "
            "(TF32 against true fp32)." for label, f in fractions.items() if f > 1]


def ddp_mfu(run: dict, ceilings: dict) -> dict | None:
    """MFU of a ``helpers.distributed`` run's fastest epoch (its ``flops_per_s``, all ranks together): on GPUs per
    device, each rank having its own; on a CPU against the whole machine's peak, which every rank shares. The
    dtype is the run's autocast dtype (bf16 or fp16), else fp32. None when the run counted no FLOPs (notebook 05)."""
    if not run.get("flops_per_s"):
        return None
    per_device = run["flops_per_s"] / (run["world_size"] if run.get("device") == "cuda" else 1)
    dtype = next((d for d in ("bfloat16", "float16") if d in str(run.get("autocast"))), "float32")
    return mfu(per_device, ceilings["device"], dtype, ceilings=ceilings)
