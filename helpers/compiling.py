"""What ``torch.compile`` buys: a training step eager against compiled, fusion of elementwise chains, graph breaks
(notebooks 08, 10 and 11)."""
from __future__ import annotations

import os
import time
import warnings

import torch

from .devices import pick_device, synchronize
from .step import train_step
from .timing import time_fn, time_train_step


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
    device = pick_device(device)
    torch.manual_seed(0)
    eager = time_train_step(make_model(), batch, device, amp=amp, host_inputs=host_inputs,
                            channels_last=channels_last, min_run_time=min_run_time)
    torch._dynamo.reset()  # compile from scratch: no graphs cached by an earlier measurement
    torch.manual_seed(0)
    model = make_model()
    try:
        require_compiler()
        compiled = torch.compile(model, mode=mode)
        step = train_step(compiled, torch.optim.SGD(compiled.parameters(), lr=0.01), batch, device, amp=amp,
                          host_inputs=host_inputs, channels_last=channels_last)  # the layout the timed steps use
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
    eager_bytes, fused_bytes = (2 * CHAIN_OPS + 2) * n * x.element_size(), 2 * n * x.element_size()
    return {"n": n, "eager_ms": eager.median_s * 1e3, "compiled_ms": comp.median_s * 1e3,
            "speedup": eager.median_s / comp.median_s, "compile_seconds": compile_s,
            "eager_bytes": eager_bytes, "fused_bytes": fused_bytes,
            "eager_gbps": eager_bytes / eager.median_s / 1e9, "fused_gbps": fused_bytes / comp.median_s / 1e9}


def graph_breaks(fn, *args) -> dict:
    """Graphs and graph breaks ``torch.compile`` finds in ``fn(*args)``, with the reasons (``torch._dynamo.explain``;
    its count is graphs - 1, so -1 when it captures no graph: 0 here) (notebook 08)."""
    torch._dynamo.reset()
    found = torch._dynamo.explain(fn)(*args)
    reasons = [str(getattr(r, "reason", r)).splitlines()[0][:160] for r in found.break_reasons]
    return {"graphs": found.graph_count, "graph_breaks": max(found.graph_break_count, 0), "ops": found.op_count,
            "reasons": reasons}
