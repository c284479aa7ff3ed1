"""Time work correctly on any device (taught in notebook 00, used from notebook 01 on).

GPU work is queued asynchronously: a host clock read right after a CUDA call measures the time to
*queue* the work, not to do it. Every clock read here is preceded by a synchronisation of the device.
"""
from __future__ import annotations

import logging
import statistics
import timeit
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch
from torch import nn

from .devices import synchronize
from .step import train_step


def _benchmark():
    """``torch.utils.benchmark``, imported on first use: importing it probes for CUDA (through cpp_extension),
    and on CPU-only machines with a CUDA build it warns "No CUDA runtime is found" — noise for learners."""
    log = logging.getLogger("torch.utils.cpp_extension")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        import torch.utils.benchmark as benchmark
    finally:
        log.setLevel(level)
    return benchmark


@dataclass
class Timing:
    """One timing result: seconds per call, as the median and spread of repeated measurements (notebook 00)."""

    label: str
    device: str
    median_s: float
    iqr_s: float
    min_s: float
    max_s: float
    runs: int
    calls_per_run: int
    times_s: list = field(default_factory=list)
    items: int | None = None              # samples per call, when a call processes a batch

    @property
    def items_per_s(self) -> float | None:
        """Throughput: ``items`` per second at the median time (None when ``items`` is unknown)."""
        return self.items / self.median_s if self.items else None

    def state_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return (f"{self.label} on {self.device}: median {format_seconds(self.median_s)} "
                f"(IQR {format_seconds(self.iqr_s)}, {self.runs} runs x {self.calls_per_run} calls)")


def format_seconds(s: float) -> str:
    """Format a duration with a readable unit: ``0.00123`` -> ``"1.23 ms"`` (notebook 00)."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(s) >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


def synced_clock(device: str | torch.device) -> Callable[[], float]:
    """Return a clock that first waits for ``device`` to finish its queued work (notebook 00)."""
    device = torch.device(device)

    def clock() -> float:
        synchronize(device)
        return timeit.default_timer()

    return clock


def time_fn(fn: Callable[[], object], device: str | torch.device = "cpu", *, label: str = "",
            warmup: int = 2, min_run_time: float = 0.2, clock: Callable[[], float] | None = None) -> Timing:
    """Time ``fn()`` on ``device``: warm-up, synchronised clock, repeated blocks, median (notebook 00).

    Built on ``torch.utils.benchmark.Timer.blocked_autorange``, with a clock that synchronises the
    device before every read (torch's default clock synchronises CUDA only, never MPS).
    """
    device = torch.device(device)
    clock = clock or synced_clock(device)
    for _ in range(warmup):
        fn()
    clock()
    timer = _benchmark().Timer(stmt="fn()", globals={"fn": fn}, timer=clock, label=label or "fn",
                            num_threads=torch.get_num_threads())
    m = timer.blocked_autorange(min_run_time=min_run_time)
    times = list(m.times)
    q = statistics.quantiles(times, n=4) if len(times) > 1 else [times[0]] * 3
    return Timing(label=label or "fn", device=str(device), median_s=statistics.median(times), iqr_s=q[2] - q[0],
                  min_s=min(times), max_s=max(times), runs=len(times), calls_per_run=m.number_per_run,
                  times_s=times)


def time_unsynchronised(fn: Callable[[], object], repeats: int = 10) -> float:
    """The *wrong* way, kept for teaching: median host-clock time of ``fn()`` with no sync (notebook 00)."""
    times = []
    for _ in range(repeats):
        t0 = timeit.default_timer()
        fn()
        times.append(timeit.default_timer() - t0)
    return statistics.median(times)


def time_train_step(model: nn.Module, batch, device: str | torch.device = "auto", *, optimizer=None, amp=False,
                    channels_last: bool = False, host_inputs=(), loss_fn=None, batch_on_host: bool = False,
                    pinned: bool = False, warmup: int = 2, min_run_time: float = 0.2, label: str = "") -> Timing:
    """Time one full training step (forward, loss, backward, optimizer) of ``model`` on a fixed ``batch``.

    The step is ``helpers.step.train_step``'s. By default the batch is moved to ``device`` once, so only compute
    is timed; ``batch_on_host=True`` copies it every step (from pinned memory with ``non_blocking`` if ``pinned``),
    to time the transfer too (notebook 03). ``optimizer`` defaults to ``SGD(lr=0.01)``. The result's
    ``items_per_s`` is samples/s (notebooks 01-06); ``helpers.profiling.step_peak_mb`` measures its memory.
    """
    prepared = train_step(model, optimizer, batch, device, loss_fn=loss_fn, amp=amp, host_inputs=host_inputs,
                          channels_last=channels_last, pinned=pinned)
    device, step = prepared.device, (lambda: prepared(prepared.host)) if batch_on_host else prepared
    t = time_fn(step, device, label=label or "training step", warmup=warmup, min_run_time=min_run_time)
    t.items = int(prepared.target.shape[0])
    return t
