"""What one operation costs on a device, and the regime it falls in: compute-, memory- or overhead-bound (notebook 08;
``helpers.ceilings`` builds the measured ceilings from these).

Every measurement runs on any device: the same functions give the CPU's numbers here and a GPU's where there is one.
Byte counts are what an operation must move at least (each input read once, each output written once), so the
bandwidths are lower bounds of what the memory system did.
"""
from __future__ import annotations

import torch

from .devices import pick_device
from .timing import time_fn

FP32_BYTES = 4


def _record(kind: str, seconds: float, flops: float, nbytes: float, **extra) -> dict:
    return {"kind": kind, "seconds": seconds, "gflops": flops / seconds / 1e9, "gbps": nbytes / seconds / 1e9,
            "intensity": flops / nbytes if nbytes else float("inf"), **extra}


def matmul_rate(n: int, device="auto", dtype=torch.float32, min_run_time: float = 0.2) -> dict:
    """An ``n×n @ n×n`` product: 2n³ FLOPs over 3n² values moved — compute-bound when n is large (notebook 08)."""
    device = pick_device(device)
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    t = time_fn(lambda: a @ b, device, min_run_time=min_run_time)
    return _record("matmul", t.median_s, 2 * n**3, 3 * n * n * a.element_size(), n=n, dtype=str(dtype))


def copy_bandwidth(n: int, device="auto", min_run_time: float = 0.2) -> dict:
    """``b.copy_(a)`` of ``n`` fp32 values: the memory ceiling (read n, write n; no arithmetic) (notebook 08)."""
    device = pick_device(device)
    a, b = torch.randn(n, device=device), torch.empty(n, device=device)
    t = time_fn(lambda: b.copy_(a), device, min_run_time=min_run_time)
    return _record("copy", t.median_s, 0, 2 * n * FP32_BYTES, n=n)


def elementwise_rate(n: int, device="auto", min_run_time: float = 0.2) -> dict:
    """``torch.add(a, b, out=c)`` on ``n`` fp32 values: 1 FLOP per 12 bytes — memory-bound (notebook 08)."""
    device = pick_device(device)
    a, b, c = (torch.randn(n, device=device) for _ in range(3))
    t = time_fn(lambda: torch.add(a, b, out=c), device, min_run_time=min_run_time)
    return _record("elementwise add", t.median_s, n, 3 * n * FP32_BYTES, n=n)


def overhead_rate(device="auto", ops: int = 200, size: int = 16, min_run_time: float = 0.2) -> dict:
    """A chain of ``ops`` tiny additions on ``size`` values: the time is per-operator overhead (notebook 08).

    Eager PyTorch pays a fixed cost per operator on every device (Python, dispatch, picking a kernel); a GPU adds
    its kernel-launch latency. Here each op's work is negligible, so seconds / ops is that fixed cost.
    """
    device = pick_device(device)
    x = torch.zeros(size, device=device)

    def chain():
        y = x
        for _ in range(ops):
            y = y + 1.0
        return y

    t = time_fn(chain, device, min_run_time=min_run_time)
    return _record("tiny ops", t.median_s, ops * size, 2 * ops * size * FP32_BYTES, ops=ops,
                   us_per_op=t.median_s / ops * 1e6)


def regime(point: dict, peak_gflops: float, peak_gbps: float, overhead_us: float) -> str:
    """Name the regime of a measurement from this machine's ceilings: compute, memory or overhead (notebook 08).

    Overhead-bound when the time is within 3× of what the per-op overhead alone would take; else whichever ceiling
    the point comes closer to (its achieved fraction of peak FLOP/s against its fraction of peak bandwidth).
    """
    ops = point.get("ops", 1)
    if point["seconds"] <= 3 * ops * overhead_us * 1e-6:
        return "overhead"
    return "compute" if point["gflops"] / peak_gflops >= point["gbps"] / peak_gbps else "memory"
