"""Measure data movement between host memory and a device (taught in notebook 03).

Every function also runs on a CPU-only machine (host-to-host copies), so the same code is tested everywhere;
pinned memory and CUDA events need CUDA and are only used there.
"""
from __future__ import annotations

import os
import re
import time

import torch

from .devices import nvidia_smi, pick_device, synchronize
from .timing import time_fn

KIB, MIB, GIB = 2**10, 2**20, 2**30
# PCIe: transfer rate per lane in GT/s and line-code efficiency, by generation
_PCIE = {1: (2.5, 8 / 10), 2: (5.0, 8 / 10), 3: (8.0, 128 / 130), 4: (16.0, 128 / 130), 5: (32.0, 128 / 130),
         6: (64.0, 242 / 256)}


def gbps(nbytes: int, seconds: float) -> float:
    """Bandwidth in GB/s (10^9 bytes per second), the unit PCIe and NVLink are quoted in (notebook 03)."""
    if seconds <= 0:
        raise ValueError("seconds must be positive")
    return nbytes / seconds / 1e9


def transfer_sizes(smallest: int = 4 * KIB, largest: int = GIB, factor: int = 4) -> list[int]:
    """Sizes in bytes from ``smallest`` to ``largest``, each ``factor`` times the previous (notebook 03)."""
    sizes, n = [], smallest
    while n <= largest:
        sizes.append(n)
        n *= factor
    return sizes


def format_bytes(n: int) -> str:
    """``4096`` -> ``"4 KiB"``, ``2**30`` -> ``"1 GiB"`` (notebook 03)."""
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} B"


def host_buffer(nbytes: int, pinned: bool = False) -> torch.Tensor:
    """A ``uint8`` host tensor of ``nbytes``; page-locked (pinned) if asked, which needs CUDA (notebook 03)."""
    t = torch.empty(nbytes, dtype=torch.uint8)
    if pinned:
        if not torch.cuda.is_available():
            raise ValueError("pinned (page-locked) memory needs a CUDA device; use pinned=False on this machine")
        t = t.pin_memory()
    return t.fill_(1)


def copy_bandwidth(nbytes: int, src="cpu", dst="cuda", *, pinned: bool = False, non_blocking: bool = False,
                   pin_each_time: bool = False, min_run_time: float = 0.2) -> dict:
    """GB/s of ``dst_buffer.copy_(src_buffer)`` for ``nbytes``, timed with a synchronised clock (notebook 03).

    ``pinned`` applies to whichever side is host memory. ``pin_each_time`` times what code that calls
    ``x.pin_memory()`` right before every copy pays: the pinning (a host copy into new page-locked memory) plus the
    copy. Returns a plain dict (a record for results files).
    """
    src, dst = pick_device(src), pick_device(dst)
    host_side = src.type == "cpu" or dst.type == "cpu"
    if (pinned or pin_each_time) and not host_side:
        raise ValueError("pinned applies to host memory: one side must be the CPU")
    if pin_each_time and (src.type != "cpu" or not torch.cuda.is_available()):
        raise ValueError("pin_each_time pins a host source, which needs CUDA: use it for host->GPU copies")
    a = host_buffer(nbytes, pinned and src.type == "cpu") if src.type == "cpu" else \
        torch.ones(nbytes, dtype=torch.uint8, device=src)
    b = host_buffer(nbytes, pinned and dst.type == "cpu") if dst.type == "cpu" else \
        torch.empty(nbytes, dtype=torch.uint8, device=dst)
    sync_on = dst if dst.type != "cpu" else src
    copy = (lambda: b.copy_(a.pin_memory(), non_blocking=non_blocking)) if pin_each_time else \
        (lambda: b.copy_(a, non_blocking=non_blocking))
    t = time_fn(copy, sync_on, warmup=2, min_run_time=min_run_time, label=f"copy {format_bytes(nbytes)} {src}->{dst}")
    return {"bytes": nbytes, "src": str(src), "dst": str(dst), "pinned": pinned, "non_blocking": non_blocking,
            "pin_each_time": pin_each_time, "seconds": t.median_s, "gbps": gbps(nbytes, t.median_s)}


def beyond_caches(bandwidth: dict, smallest: int = 256 * MIB) -> float | None:
    """Median GB/s over the sizes of ``{bytes: GB/s}`` of at least ``smallest``: main memory, not a CPU cache (notebook
    03). None when no size is that large (quick mode stays inside the caches) (notebook 03)."""
    big = sorted(v for s, v in bandwidth.items() if int(s) >= smallest)
    return big[len(big) // 2] if big else None


def cuda_event_copy_gbps(nbytes: int, repeats: int = 20) -> float:
    """Pinned host->GPU bandwidth timed with plain CUDA events, no helpers in the way (benchmark reference).
    (notebook 03)"""
    if not torch.cuda.is_available():
        raise ValueError("CUDA events need a CUDA device")
    a = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    b = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    for _ in range(3):
        b.copy_(a, non_blocking=True)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        start.record()
        b.copy_(a, non_blocking=True)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    return gbps(nbytes, times[len(times) // 2])


_LINK_FIELDS = ["index", "uuid", "name", "pcie.link.gen.max", "pcie.link.width.max"]


def _cuda_uuid(device: torch.device) -> str | None:
    """The UUID of a torch CUDA device as nvidia-smi prints it, without its ``GPU-`` prefix (None if unknown)."""
    try:
        return str(torch.cuda.get_device_properties(device).uuid).lower().removeprefix("gpu-")
    except (AttributeError, RuntimeError, AssertionError):
        return None


def _smi_row(rows: list, device: torch.device) -> dict | None:
    """The nvidia-smi row of ``device``: matched by UUID, else by position in ``CUDA_VISIBLE_DEVICES``."""
    uuid = _cuda_uuid(device)
    for row in rows:
        if uuid and row["uuid"].lower().removeprefix("gpu-") == uuid:
            return row
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    index = device.index or 0
    wanted = visible[index] if index < len(visible) and visible[index].isdigit() else str(index)
    return next((row for row in rows if row["index"] == wanted), None)


def pcie_link(device="cuda") -> dict | None:
    """The host link of the GPU in use: PCIe generation × width (their maximum, not the idle current value) and its
    theoretical GB/s; on Grace-Hopper/Blackwell superchips the host link is NVLink-C2C, not PCIe (notebook 03).

    Returns None when unknown (no nvidia-smi, no matching GPU). An idle GPU drops its link to Gen1 to save power,
    so ``pcie.link.gen.current`` would draw a wrong ceiling; the ``max`` fields do not change with load.
    """
    rows = nvidia_smi(_LINK_FIELDS)
    row = _smi_row(rows, torch.device(device)) if rows else None
    if row is None:
        return None
    if re.search(r"\bG[HB]\d{3}", row["name"]):
        return {"kind": "nvlink-c2c", "name": row["name"], "generation": None, "width": None, "gbps": None}
    try:
        gen, width = int(row["pcie.link.gen.max"]), int(row["pcie.link.width.max"])
    except ValueError:
        return None
    return {"kind": "pcie", "name": row["name"], **pcie_theoretical(gen, width)}


def pcie_theoretical(gen: int, width: int) -> dict:
    """Theoretical one-direction bandwidth of a PCIe link, e.g. gen 4 x16 -> about 31.5 GB/s (notebook 03)."""
    if gen not in _PCIE:
        raise ValueError(f"unknown PCIe generation {gen}")
    rate, efficiency = _PCIE[gen]
    return {"generation": gen, "width": width, "gbps": rate * efficiency * width / 8}


def overlapped_steps(batches: list, compute, device, *, overlap: bool) -> float:
    """Seconds to copy each host batch to ``device`` and run ``compute`` on it, with or without overlap (notebook 03).

    With ``overlap`` on CUDA, batch i+1 is copied on a side stream while batch i is computed (the copy engine and
    the compute engine work at once); elsewhere, and without ``overlap``, copy and compute alternate.
    """
    device = pick_device(device)
    use_stream = overlap and device.type == "cuda"
    side = torch.cuda.Stream(device) if use_stream else None
    synchronize(device)
    t0 = time.perf_counter()
    if use_stream:
        main = torch.cuda.current_stream(device)
        with torch.cuda.stream(side):
            nxt = batches[0].to(device, non_blocking=True)
        for i in range(len(batches)):
            main.wait_stream(side)  # the copy of batch i is done before compute uses it
            cur = nxt
            cur.record_stream(main)  # its memory is in use on the main stream too
            if i + 1 < len(batches):
                with torch.cuda.stream(side):
                    nxt = batches[i + 1].to(device, non_blocking=True)
            compute(cur)
    else:
        for b in batches:
            compute(b.to(device, non_blocking=overlap))
    synchronize(device)
    return time.perf_counter() - t0
