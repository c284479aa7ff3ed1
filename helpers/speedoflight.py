"""The speed of light: what the hardware can do, and the step time that implies (taught in notebook 08; the
predicted GPU numbers of notebooks 01-06 are built with it).

- ``measured_ceilings`` measures this machine once (the best matmul FLOP/s per dtype over a few large sizes, the
  memory bandwidth of a copy far larger than the caches, the cost of one tiny operator) with the measurements of
  ``helpers.regimes``, and caches the result per machine and torch version in the user's cache folder;
- ``datasheet`` reads ``data/gpu_datasheet.json``: dense peak FLOP/s per dtype, memory bandwidth and host link of the
  GPUs a learner may meet or rent, each number with its source; ``datasheet_ceilings`` turns an entry into ceilings;
- ``predict_step`` is a per-operator roofline: it turns the counts of ``helpers.counting.count_step`` and a set of
  ceilings into a predicted step time and names the regime that binds. Nothing here is fitted to a measurement.
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

from .devices import float32_precision
from .results import cache_dir, course_file

SCHEMA = 1
MIB = 2**20
# Square matmul sizes searched per device type, and the dtypes measured (a "maximum achievable matmul" search:
# the best of several sizes, since one size can miss the tiling a library does best).
MATMUL_SIZES = {"cpu": (512, 1024, 2048), "cuda": (4096, 6144, 8192), "mps": (2048, 3072, 4096)}
# The datasheet GPUs a prediction shows by default: a free notebook's GPU, a common rental, a current flagship.
DEFAULT_GPUS = ("T4", "A100 80GB SXM", "H100 SXM")
PREDICTED = "predicted from the datasheet, not measured"
# torch.cuda.get_device_name() patterns for the datasheet's entries (first match wins).
DEVICE_NAMES = ((r"H100.*PCIe", "H100 PCIe"), (r"H100", "H100 SXM"), (r"H200", "H200 SXM"),
                (r"A100.*80", "A100 80GB SXM"), (r"\bL4\b", "L4"), (r"\bT4\b", "T4"), (r"RTX 4090", "GeForce RTX 4090"))
MATMUL_DTYPES = {"cpu": ("float32", "bfloat16"), "cuda": ("float32", "tf32", "bfloat16", "float16"),
                 "mps": ("float32", "float16", "bfloat16")}


def ceilings_key(device: torch.device) -> str:
    """The cache key of ``device``'s ceilings: hardware name, device, torch version and CPU threads (notebook 08)."""
    from .devices import hardware_name

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

    Uses ``helpers.regimes.matmul_rate``. ``"tf32"`` is fp32 inputs with TF32 tensor cores allowed, ``"float32"``
    true fp32 (``helpers.devices.float32_precision``); a dtype the device cannot multiply is skipped.
    """
    from .devices import float32_precision
    from .regimes import matmul_rate

    device = torch.device(device)
    best, points = {}, []
    for name in dtypes or MATMUL_DTYPES.get(device.type, ("float32",)):
        dtype = torch.float32 if name == "tf32" else getattr(torch, name)
        with float32_precision("tf32" if name == "tf32" else "ieee"):
            for n in sizes or MATMUL_SIZES.get(device.type, (1024,)):
                try:
                    rate = matmul_rate(n, device, dtype=dtype, min_run_time=min_run_time)["gflops"] * 1e9
                except (RuntimeError, TypeError) as err:  # a dtype this device has no matmul for
                    points.append({"dtype": name, "n": n, "error": str(err).splitlines()[0][:120]})
                    break
                points.append({"dtype": name, "n": n, "flops_per_s": rate})
                best[name] = max(best.get(name, 0.0), rate)
    return {"flops_per_s": best, "matmul": points}


def _measure(device: torch.device, min_run_time: float) -> dict:
    from .regimes import copy_bandwidth, overhead_rate

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
    caches (``helpers.regimes.copy_bandwidth``, read + write counted); ``op_s``: seconds per tiny operator
    (``helpers.regimes.overhead_rate``: Python, dispatch and, on a GPU, the launch, as the host issues them);
    ``launch_s``: the host's cost of a kernel launch beyond ``op_s``, 0 here (the tiny operator timed on the device
    in use already includes its launch); ``overlap``: whether the host runs ahead of
    the device (a GPU) or does the work itself (a CPU). Cached as JSON under ``cache_dir()`` keyed by
    ``ceilings_key``; ``refresh=True`` measures again; ``measure=False`` returns None rather than measure (a
    training process that must not stop for it, e.g. one DDP rank of several). Never adjusted to make a prediction agree. The load
    average at the time is recorded: ceilings measured while other programs ran (a load above the CPU count) are
    low; measure again with ``refresh=True`` on a quiet machine.
    """
    from .devices import describe, pick_device, usable_cpus

    device = pick_device(device)
    path = cache_dir() / "ceilings" / f"{ceilings_key(device)}.json"
    if path.exists() and not refresh:
        found = json.loads(path.read_text())
        if found.get("schema") == SCHEMA:
            return {**found, "cache": str(path), "cached": True}
    if not measure:
        return None
    found = {"schema": SCHEMA, "key": ceilings_key(device), "device": str(device), "hardware": describe()["name"],
             "torch": torch.__version__, "threads": torch.get_num_threads(),
             "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
             "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None, "cpus": usable_cpus(),
             **_measure(device, min_run_time)}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(found, indent=1))
    tmp.replace(path)  # atomic: two kernels measuring at once never leave half a file
    return {**found, "cache": str(path), "cached": False}


def datasheet_path() -> Path:
    """``data/gpu_datasheet.json`` in the course's folder (notebook 08)."""
    return course_file("data", "gpu_datasheet.json")


@functools.lru_cache(maxsize=4)
def _datasheet_file(path: str) -> dict:
    """The parsed datasheet file, read once per process (every prediction consults it; nothing may modify it)."""
    return json.loads(Path(path).read_text())


def _gpu_count(model, batch, device="cpu", **count_kw):
    """``count_step`` of the step as a CUDA GPU runs it: the optimizer's foreach kernels, where a CPU runs a
    for-loop over the parameters (``counting.count_step``), unless ``count_kw`` says otherwise."""
    from .counting import count_step

    return count_step(model, batch, device, **{"foreach": True, **count_kw})


def _host_op_s(op_s: float | None) -> float:
    """The host's cost per operator for a prediction: ``op_s``, or this machine's CPU's measured one."""
    return measured_ceilings("cpu")["op_s"] if op_s is None else op_s


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
    from .transfer import pcie_theoretical

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


def _peak(rates: dict, dtype: str) -> float:
    """The peak for an operator's dtype, else the fp32 one; a dtype with neither is an error, not a guess."""
    peak = rates.get(dtype) or rates.get("float32")
    if not peak:
        raise ValueError(f"the ceilings have no peak for {dtype} (nor float32): {sorted(rates)}")
    return peak


def predict_step(work, ceilings: dict) -> dict:
    """Predict a training step's time from its counts and a machine's ceilings: a per-operator roofline (notebook 08).

    Each operator's device time is ``max(flops / peak of its dtype, bytes / bandwidth)`` (compute- or memory-bound,
    whichever is slower); the host pays ``op_s`` per operator dispatched and ``launch_s`` per kernel it launches; a
    host→device copy takes ``h2d_bytes / h2d_bytes_per_s`` when the ceilings know the link. Overlap: on a CPU the host does
    the work itself, so the step is host + device time, summed; on a GPU (``overlap`` True) the host runs ahead of
    the device, so the step is ``max(host, device)``, the slower of the two, not their sum. Returns seconds per
    regime, the step, and ``bound``: ``"overhead"`` when the host's dispatching (or, summed, the per-operator costs)
    takes longest, else ``"compute"``, ``"memory"`` or ``"transfer"``, the largest share of the device time.
    ``work`` is a ``StepWork`` or its ``state_dict()``.
    """
    work = work.state_dict() if hasattr(work, "state_dict") else work
    rates, bandwidth = ceilings["flops_per_s"], ceilings["bytes_per_s"]
    compute_s = memory_s = 0.0
    by_op: dict[str, float] = {}
    for row in work["rows"]:
        c = row["flops"] / _peak(rates, row["dtype"]) if row["flops"] else 0.0
        m = row["bytes"] / bandwidth
        seconds = max(c, m) * row["calls"]
        compute_s, memory_s = (compute_s + seconds, memory_s) if c >= m else (compute_s, memory_s + seconds)
        by_op[row["op"]] = by_op.get(row["op"], 0.0) + seconds
    link = ceilings.get("h2d_bytes_per_s")
    transfer_s = work.get("h2d_bytes", 0) / link if link else 0.0
    launch_s = work["kernels"] * ceilings.get("launch_s", 0.0)
    host_s = work["ops"] * ceilings["op_s"] + launch_s
    device_s = compute_s + memory_s + transfer_s
    overhead_s = host_s
    shares = {"compute": compute_s, "memory": memory_s, "transfer": transfer_s}
    if ceilings.get("overlap"):
        step_s = max(host_s, device_s)
        bound = "overhead" if host_s >= device_s else max(shares, key=shares.get)
    else:
        step_s = host_s + device_s
        bound = max({**shares, "overhead": overhead_s}.items(), key=lambda kv: kv[1])[0]
    top = dict(sorted(by_op.items(), key=lambda kv: kv[1], reverse=True)[:8])
    return {"step_s": step_s, "compute_s": compute_s, "memory_s": memory_s, "overhead_s": overhead_s,
            "transfer_s": transfer_s, "host_s": host_s, "device_s": device_s, "bound": bound,
            "overlap": bool(ceilings.get("overlap")), "top_ops_s": top}


def chosen_gpus() -> tuple:
    """The datasheet GPUs the lessons predict for: ``$COURSE_GPUS`` (a comma list of datasheet names, or ``all``),
    else ``DEFAULT_GPUS``; a name the datasheet lacks is a one-line error that lists the names it has (notebook 08)."""
    wanted = os.environ.get("COURSE_GPUS", "").strip()
    if not wanted:
        return DEFAULT_GPUS
    known = tuple(datasheet())
    if wanted.lower() == "all":
        return known
    names = tuple(n.strip() for n in wanted.split(",") if n.strip())
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"COURSE_GPUS names {', '.join(map(repr, unknown))}, which data/gpu_datasheet.json does not "
                         f"hold; choose from {', '.join(known)}, or all")
    return names


def gpus_here(gpus=None) -> tuple:
    """``gpus``, or by default the GPUs of ``chosen_gpus`` (``$COURSE_GPUS``) and the datasheet entry of the CUDA
    GPU in use, if it has one: on a GPU the datasheet knows, every prediction can be set against a measurement
    (notebooks 01-08)."""
    if gpus is not None:
        return tuple(gpus)
    chosen = chosen_gpus()
    own = datasheet_name(torch.device("cuda", torch.cuda.current_device())) if torch.cuda.is_available() else None
    return chosen + ((own,) if own and own not in chosen else ())


def usable(predictions: dict, say=print) -> dict:
    """The predictions of ``predict_gpus`` that hold a prediction; each GPU skipped is said with its reason (a GPU
    whose datasheet lacks the dtype), never dropped silently (notebooks 01-08)."""
    for gpu, p in predictions.items():
        if "skipped" in p:
            say(f"{gpu}: not predicted ({p['skipped']})")
    return {gpu: p for gpu, p in predictions.items() if "skipped" not in p}


def measured_over_predicted(measured: dict, predicted: dict) -> dict:
    """``{key: measured / predicted}`` for every key both hold a positive number for (a nested dict: per key, the
    same again) — how far a prediction was from the measurement on the GPU it was made for (notebooks 01-08)."""
    found = {}
    for key, m in measured.items():
        p = predicted.get(key)
        if isinstance(m, dict) and isinstance(p, dict):
            inner = measured_over_predicted(m, p)
            found.update({key: inner} if inner else {})
        elif isinstance(m, (int, float)) and isinstance(p, (int, float)) and m > 0 and p > 0:
            found[key] = m / p
    return found


def predict_gpus(work, gpus=None, *, op_s: float | None = None, copy_batch: bool = True) -> dict:
    """``predict_step`` of ``work`` on each datasheet GPU in ``gpus``: ``{name: prediction}`` (notebooks 01-08).

    The host's per-operator cost ``op_s`` is this machine's (default: ``measured_ceilings("cpu")``); each kernel adds
    the cited launch cost, and the batch crosses the host link (``input_bytes``, when the count saw no copy). A GPU
    whose datasheet has no peak for the work's dtype gets ``{"skipped": why}`` instead:
    a missing number is never guessed. Every prediction carries ``label``: ``PREDICTED``.
    """
    sheet, work, gpus = datasheet(), dict(work.state_dict() if hasattr(work, "state_dict") else work), gpus_here(gpus)
    # counted on a CPU, the step copied nothing: a GPU run copies the batch (unless it is resident: copy_batch False)
    work["h2d_bytes"] = max(work.get("h2d_bytes", 0), work.get("input_bytes", 0)) if copy_batch else 0
    op_s = _host_op_s(op_s)
    found, dtype = {}, main_dtype(work)
    for name in gpus:
        try:
            if dtype not in sheet[name]["flops_per_s"]:  # no fall-back to another dtype's peak: that is a guess
                raise ValueError(f"the datasheet has no {dtype} peak for {name}")
            found[name] = {**predict_step(work, datasheet_ceilings(sheet[name], op_s=op_s)), "label": PREDICTED}
        except (KeyError, ValueError) as err:
            found[name] = {"skipped": str(err).strip("'\"")}
    return found


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
    peak = _peak(ceilings["flops_per_s"], dtype)
    found = {"flops_per_s": flops_per_s, "dtype": dtype, "peak_flops_per_s": peak, "mfu": flops_per_s / peak,
             "peak": f"measured matmul peak of {ceilings.get('hardware', device)} ({ceilings.get('device', device)})"}
    name = datasheet_name(ceilings.get("device", device))
    rates = datasheet()[name]["flops_per_s"] if name else {}
    if name and (dtype in rates or "float32" in rates):
        sheet_peak = rates.get(dtype, rates.get("float32"))["value"]
        found.update(datasheet_gpu=name, datasheet_peak_flops_per_s=sheet_peak, datasheet_mfu=flops_per_s / sheet_peak)
    return found


def predicted_sweep(points: dict, gpus=None, *, op_s: float | None = None, copy_batch: bool = True,
                    **count_kw) -> dict:
    """Count one step per sweep point and predict it on each GPU: ``points`` maps x (a batch size, a width) to
    ``(model, batch)``; ``count_kw`` go to ``count_step`` (notebooks 01 and 02). ``copy_batch=False`` predicts the
    step with its batch already on the GPU, as ``helpers.timing.time_train_step`` times it by default.

    Returns ``{"items_per_s": {gpu: {x: predicted items/s}}, "step_s": {gpu: {x: s}}, "bound": {gpu: {x: regime}},
    "skipped": {gpu: why}, "work": {x: {"flops", "bytes", "ops", "kernels"}}, "label": PREDICTED}``.
    """
    op_s = _host_op_s(op_s)
    found = {"items_per_s": {}, "step_s": {}, "bound": {}, "skipped": {}, "work": {}, "label": PREDICTED}
    for x, (model, batch) in points.items():
        work = _gpu_count(model, batch, "cpu", **count_kw)
        found["work"][x] = {k: getattr(work, k) for k in ("flops", "bytes", "ops", "kernels", "items")}
        for gpu, p in predict_gpus(work, gpus, op_s=op_s, copy_batch=copy_batch).items():
            if "skipped" in p:
                found["skipped"][gpu] = p["skipped"]
                continue
            found["step_s"].setdefault(gpu, {})[x] = p["step_s"]
            found["items_per_s"].setdefault(gpu, {})[x] = work.items / p["step_s"]
            found["bound"].setdefault(gpu, {})[x] = p["bound"]
    return found


def predicted_matmul(sizes, dtype: str = "float32", gpus=None, *, op_s: float | None = None,
                     detail: bool = False) -> dict:
    """Predicted GFLOP/s of an ``n×n @ n×n`` product on each datasheet GPU, for each ``n`` in ``sizes``: one operator
    of ``2n³`` FLOPs reading two and writing one ``n×n`` matrix, timed back to back as notebook 02 times it (the
    host issues the next call while the device works). ``{gpu: {n: GFLOP/s}}``, or with ``detail``
    ``{gpu: {n: {"gflops", "bound"}}}`` (the regime that binds, notebook 08); a GPU without a peak for ``dtype``
    is left out (notebook 02)."""
    op_s = _host_op_s(op_s)
    itemsize = torch.empty(0, dtype=getattr(torch, "float32" if dtype == "tf32" else dtype)).element_size()
    found = {}
    for n in sizes:
        work = {"rows": [{"op": "aten.mm", "dtype": dtype, "flops": 2 * n**3, "bytes": 3 * n * n * itemsize,
                          "kernel": True, "calls": 1}], "ops": 1, "kernels": 1, "h2d_bytes": 0}
        for gpu, p in predict_gpus(work, gpus, op_s=op_s).items():
            if "step_s" in p:
                gflops = 2 * n**3 / p["step_s"] / 1e9
                found.setdefault(gpu, {})[n] = {"gflops": gflops, "bound": p["bound"]} if detail else gflops
    return found


def predicted_copy(sizes, gpus=None, *, op_s: float | None = None) -> dict:
    """Predicted host→device bandwidth from pinned memory on each datasheet GPU's PCIe link, for each size in bytes:
    ``size / (per-copy host cost + size / link rate)``, the per-copy cost being this machine's cost per operator plus
    the cited launch cost, the link rate the theoretical one-direction rate of its generation and width
    (``helpers.transfer.pcie_theoretical``). ``{gpu: {"link", "gbps": {size: GB/s}}}``; a GPU whose link is not a
    PCIe link of known width is left out (notebook 03)."""
    from .transfer import pcie_theoretical

    op_s = _host_op_s(op_s)
    fixed, found, sheet = op_s + launch_cost()["value"], {}, datasheet()
    for gpu in gpus_here(gpus):
        link = sheet[gpu].get("host_link", {})
        if link.get("kind") != "PCIe" or not (link.get("generation") and link.get("lanes")):
            continue
        rate = pcie_theoretical(link["generation"], link["lanes"])["gbps"] * 1e9
        found[gpu] = {"link": f"PCIe Gen{link['generation']} x{link['lanes']}",
                      "gbps": {s: s / (fixed + s / rate) / 1e9 for s in sizes}}
    return found


def ddp_mfu(run: dict, ceilings: dict) -> dict | None:
    """MFU of a ``helpers.distributed`` run's fastest epoch (its ``flops_per_s``, all ranks together): on GPUs per
    device, each rank having its own; on a CPU against the whole machine's peak, which every rank shares. The
    dtype is the run's autocast dtype (bf16 or fp16), else fp32. None when the run counted no FLOPs (notebook 05)."""
    if not run.get("flops_per_s"):
        return None
    per_device = run["flops_per_s"] / (run["world_size"] if run.get("device") == "cuda" else 1)
    dtype = next((d for d in ("bfloat16", "float16") if d in str(run.get("autocast"))), "float32")
    return mfu(per_device, ceilings["device"], dtype, ceilings=ceilings)


def _relabelled(work, old: str, new: str):
    """``work``'s counts with the operators of dtype ``old`` marked as ``new`` (same sizes, another peak)."""
    found = work.state_dict() if hasattr(work, "state_dict") else dict(work)
    found["rows"] = [{**r, "dtype": new if r["dtype"] == old else r["dtype"]} for r in found["rows"]]
    return found


def predicted_training(make_model, batch, *, images: int, epochs: int = 1, amp: bool = False, gpus=None,
                       input_items_per_s: float | None = None, op_s: float | None = None, **count_kw) -> dict:
    """Predicted time of ``epochs`` epochs of ``images`` items, in steps like one on ``batch``, on one of each
    datasheet GPU (notebook 05): ``{gpu: {"epoch_s", "total_s", "step_s", "bound", "dtype", "label"}}``.

    ``amp=True`` counts the step in the dtype autocast picks on that GPU (``helpers.step.resolve_amp``): bf16
    where the datasheet has a bf16 peak, else fp16. An fp16 step is the bf16 count with its dtype renamed: both are
    2-byte types that autocast applies to the same operators, and a CPU without fp16 arithmetic would take many
    times longer to run the step in fp16 than to count it in bf16. ``input_items_per_s``: the input pipeline's rate as measured
    here; an epoch takes at least ``images / input_items_per_s`` and ``bound`` says ``"input"`` when that binds.
    """
    sheet, works, found, gpus = datasheet(), {}, {}, gpus_here(gpus)
    steps = -(-images // int(batch[-1].shape[0]))
    for gpu in gpus:
        dtype = ("bfloat16" if "bfloat16" in sheet[gpu]["flops_per_s"] else "float16") if amp else None
        for need in (["bfloat16"] if dtype == "float16" else []) + [dtype]:
            if need not in works:  # fp16: the bf16 count, relabelled (see the docstring)
                works[need] = _relabelled(works["bfloat16"], "bfloat16", "float16") if need == "float16" else \
                    _gpu_count(make_model(), batch, "cpu", amp=need or False, **count_kw)
        p = predict_gpus(works[dtype], (gpu,), op_s=op_s)[gpu]
        if "skipped" in p:
            found[gpu] = p
            continue
        model_s, input_s = steps * p["step_s"], images / input_items_per_s if input_items_per_s else 0.0
        found[gpu] = {"epoch_s": max(model_s, input_s), "total_s": epochs * max(model_s, input_s),
                      "step_s": p["step_s"], "bound": "input" if input_s > model_s else p["bound"],
                      "dtype": dtype or "float32", "label": PREDICTED}
    return found


def predicted_amp_speedup(make_model, batch, gpus=None, *, op_s: float | None = None, **count_kw) -> dict:
    """Predicted speed-up of autocast (bf16 where the datasheet has a bf16 peak, else fp16) over true fp32 for one
    training step on ``batch``, per datasheet GPU (notebook 06): ``{gpu: {"fp32_ms", "amp_ms", "amp_dtype",
    "speedup", "bound": {"fp32", "amp"}, "label"}}``, or ``{"skipped": why}``."""
    items, gpus = int(batch[-1].shape[0]), gpus_here(gpus)
    plain = predicted_training(make_model, batch, images=items, gpus=gpus, op_s=op_s, **count_kw)
    mixed = predicted_training(make_model, batch, images=items, amp=True, gpus=gpus, op_s=op_s, **count_kw)
    found = {}
    for gpu in gpus:
        a, b = plain[gpu], mixed[gpu]
        if "skipped" in a or "skipped" in b:
            found[gpu] = {"skipped": a.get("skipped") or b.get("skipped")}
            continue
        found[gpu] = {"fp32_ms": a["step_s"] * 1e3, "amp_ms": b["step_s"] * 1e3, "amp_dtype": b["dtype"],
                      "speedup": a["step_s"] / b["step_s"], "bound": {"fp32": a["bound"], "amp": b["bound"]},
                      "label": PREDICTED}
    return found


def check_predictions(cases: dict, device="cpu", *, ceilings: dict | None = None, min_run_time: float = 0.3,
                      gpus=None) -> dict:
    """Predict each case on ``device`` from its counts and the device's measured ceilings, then measure it: the
    model checked where it can be (notebook 08). ``cases`` maps a name to ``{"model", "batch", **count_step
    options}`` (a training step, timed by ``helpers.timing.time_train_step``) or ``{"fn", "args"}`` (one call,
    timed by ``helpers.timing.time_fn``). Returns ``{name: {"flops", "bytes", "ops", "kernels", "predicted_s",
    "measured_s", "ratio" (measured / predicted), "bound", "gpus"}}``, ``gpus`` holding the same counts predicted on
    each datasheet GPU (``predict_gpus``). Nothing is fitted: the ceilings are measured once. Every case is timed
    in true fp32 (``float32_precision("ieee")``): the fp32 peak it is divided by is true fp32's, while cuDNN's
    convolutions and RNNs would run TF32 by default on Ampere and newer GPUs.
    """
    from .counting import count_fn, count_step
    from .timing import time_fn, time_train_step

    ceilings = ceilings or measured_ceilings(device)
    host_op_s = ceilings["op_s"] if str(ceilings.get("device", "cpu")) == "cpu" else None  # a CPU's, not a GPU's
    found = {}
    with float32_precision("ieee"):
        for name, case in cases.items():
            case = dict(case)  # a call's inputs live on the device already; a training step copies its batch
            if "fn" in case:
                fn, args = case["fn"], [a.to(device) for a in case["args"]]
                work = gpu_work = count_fn(fn, *[a.cpu() for a in case["args"]])
                measured = time_fn(lambda: fn(*args), device, min_run_time=min_run_time).median_s
            else:
                model, batch = case.pop("model"), case.pop("batch")
                work = count_step(model, batch, device, **case)  # counts on a copy: model stays untrained
                gpu_work = work if torch.device(device).type == "cuda" else _gpu_count(model, batch, device, **case)
                options = {k: v for k, v in case.items() if k in ("optimizer", "amp", "host_inputs", "channels_last")}
                if isinstance(options.get("optimizer"), type):  # a class: time_train_step wants an instance
                    options["optimizer"] = options["optimizer"](model.parameters(), lr=0.01)
                measured = time_train_step(model, batch, device, min_run_time=min_run_time, **options).median_s
            p = predict_step(work, ceilings)
            on_gpus = {gpu: {k: g[k] for k in ("step_s", "bound")} if "step_s" in g else g
                       for gpu, g in predict_gpus(gpu_work, gpus, op_s=host_op_s, copy_batch="fn" not in case).items()}
            found[name] = {"flops": work.flops, "bytes": work.bytes, "ops": work.ops, "kernels": work.kernels,
                           "predicted_s": p["step_s"], "measured_s": measured, "ratio": measured / p["step_s"],
                           "bound": p["bound"], "gpus": on_gpus}
    return found
