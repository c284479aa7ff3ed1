"""Compute-, memory- or overhead-bound? Measured ceilings, and what ``torch.compile`` buys (taught in notebook 08).

Every measurement runs on any device: the same functions give the CPU's numbers here and a GPU's where there is one.
Byte counts are what an operation must move at least (each input read once, each output written once), so the
bandwidths are lower bounds of what the memory system did.
"""
from __future__ import annotations

import os
import time
import warnings

import torch
import torch._dynamo

from .devices import pick_device, synchronize
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


def _first_call_seconds(step, device) -> float:
    """Seconds of a compiled function's first call, timed cold: inductor's on-disk cache bypassed (a hit would time
    loading kernels, not compiling them)."""
    import torch._inductor.config

    cold = {"force_disable_caches": True} if hasattr(torch._inductor.config, "force_disable_caches") else {}
    with torch._inductor.config.patch(cold), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="dynamo_pgo force disabled")  # what ``cold`` asked for
        synchronize(device)
        t0 = time.perf_counter()
        step()
        synchronize(device)
    return time.perf_counter() - t0


def require_compiler() -> None:
    """Raise before ``torch.compile`` (notebooks 08, 10) when the run was told inductor cannot build kernels here
    (``make gpu-check``'s pre-flight found no C compiler or no Python.h and set ``COURSE_NO_COMPILE=1``): one
    clear error instead of a failure per compile."""
    if os.environ.get("COURSE_NO_COMPILE") == "1":
        raise RuntimeError("torch.compile skipped: no C compiler or Python.h on this machine (COURSE_NO_COMPILE=1)")


def compare_compiled(make_model, batch, device="auto", *, amp=False, mode: str | None = None, host_inputs=(),
                     channels_last: bool = False, min_run_time: float = 0.5) -> dict:
    """The same training step eager and under ``torch.compile``: step times, compile seconds, break-even steps.

    ``make_model()`` builds the model (seeded identically for both); the first compiled step compiles the forward
    and backward graphs, and its extra time over an eager step is ``compile_seconds``. ``break_even_steps`` is how
    many steps the faster compiled step needs to win that time back (None if it is not faster). A missing C++
    compiler or an unsupported model gives ``{"error": ...}`` instead of a crash (notebook 08). The compile is timed
    cold, inductor's caches bypassed: what a first run pays; a rerun of the same program on the same machine loads
    the kernels from inductor's on-disk cache and pays less.
    """
    from .timing import time_train_step
    from .step import train_step

    device = pick_device(device)
    torch.manual_seed(0)
    eager = time_train_step(make_model(), batch, device, amp=amp, host_inputs=host_inputs,
                            channels_last=channels_last, min_run_time=min_run_time)
    torch._dynamo.reset()  # compile from scratch: no graphs cached by an earlier measurement
    torch.manual_seed(0)
    model = make_model()
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    try:
        require_compiler()
        compiled = torch.compile(model, mode=mode)
        step = train_step(compiled, torch.optim.SGD(compiled.parameters(), lr=0.01), batch, device, amp=amp,
                          host_inputs=host_inputs)
        first = _first_call_seconds(step, device)
        steady = time_train_step(compiled, batch, device, amp=amp, host_inputs=host_inputs, warmup=1,
                                 channels_last=channels_last, min_run_time=min_run_time)
    except Exception as exc:  # inductor needs a C++ compiler (CPU) or Triton (GPU); say why, don't crash
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}", "eager_ms": eager.median_s * 1e3}
    compile_s = max(first - eager.median_s, 0.0)
    gain = eager.median_s - steady.median_s
    return {"eager_ms": eager.median_s * 1e3, "compiled_ms": steady.median_s * 1e3,
            "speedup": eager.median_s / steady.median_s, "compile_seconds": compile_s,
            "break_even_steps": compile_s / gain if gain > 0 else None, "mode": mode or "default"}


def elementwise_chain(x: torch.Tensor) -> torch.Tensor:
    """Eight elementwise operations in a row (a GELU-like activation written out): the fusion example (notebook 08)."""
    y = x * 0.5
    y = y + 0.25
    y = torch.tanh(y)
    y = y * x
    y = y - 0.125
    y = torch.sigmoid(y)
    y = y * 1.5
    return y + x


CHAIN_OPS = 8


def fusion(n: int, device="auto", min_run_time: float = 0.3) -> dict:
    """``elementwise_chain`` on ``n`` fp32 values, eager against compiled: time and the bytes each must move.

    Eager runs 8 kernels, each reading its input and writing its output: about 2·8·n·4 bytes (plus the second read
    of ``x``). Compiled, inductor fuses them into one kernel that reads ``x`` once and writes once: 2·n·4 bytes.
    A memory-bound chain speeds up by about the ratio of bytes moved (notebook 08).
    """
    device = pick_device(device)
    x = torch.randn(n, device=device)
    eager = time_fn(lambda: elementwise_chain(x), device, min_run_time=min_run_time)
    torch._dynamo.reset()
    try:
        require_compiler()
        fused = torch.compile(elementwise_chain)
        compile_s = _first_call_seconds(lambda: fused(x), device)
        comp = time_fn(lambda: fused(x), device, min_run_time=min_run_time)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
    eager_bytes, fused_bytes = (2 * CHAIN_OPS + 2) * n * FP32_BYTES, 2 * n * FP32_BYTES
    return {"n": n, "eager_ms": eager.median_s * 1e3, "compiled_ms": comp.median_s * 1e3,
            "speedup": eager.median_s / comp.median_s, "compile_seconds": compile_s,
            "eager_bytes": eager_bytes, "fused_bytes": fused_bytes,
            "eager_gbps": eager_bytes / eager.median_s / 1e9, "fused_gbps": fused_bytes / comp.median_s / 1e9}


def graph_breaks(fn, *args) -> dict:
    """Graphs and graph breaks ``torch.compile`` finds in ``fn(*args)``, with the reasons (``torch._dynamo.explain``).
    (notebook 08)"""
    torch._dynamo.reset()
    found = torch._dynamo.explain(fn)(*args)
    reasons = [str(getattr(r, "reason", r)).splitlines()[0][:160] for r in found.break_reasons]
    return {"graphs": found.graph_count, "graph_breaks": found.graph_break_count, "ops": found.op_count,
            "reasons": reasons}
