"""Where a training step's time and memory go: profiler traces, step phases, peak memory (taught in notebook 09).

``profile_training`` and ``step_phases`` time a step's phases from a trace; ``verdict`` names what bounds it;
``peak_mb`` is the course's one measure of memory; ``find_max_batch`` and ``Checkpointed`` fit a batch into it.
"""
from __future__ import annotations

import gc
import json
import os
import statistics
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function, schedule
from torch.utils.checkpoint import checkpoint

from .devices import synchronize
from .step import BOUNDS, split_batch, train_step
from .timing import time_train_step

PHASES = ("data wait", "host to device", "forward", "backward", "optimizer")
PHASE_PREFIX = "phase/"       # record_function names: "phase/forward", ...
INPUT_BOUND_SHARE = 0.2       # input phases (data wait + copy) at least this share of the step: input-bound
OVERHEAD_BOUND_BUSY = 0.5     # device busy less than this share of the compute phases: overhead-bound
FLOOR_EXPLAINS = 0.5          # the largest floor explains the step from this share on (else "is the closest")
FLOOR_FAR = 0.1               # every floor below this share of the step: overhead the operator count does not see
GPU_KERNEL_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def quiet_profiler(device: str | torch.device) -> None:
    """Without a GPU, silence the "gpuGetDeviceCount failed" and start/stop lines of a CUDA build's profiler (notebook 09).

    Sets ``KINETO_LOG_LEVEL`` (unless you set it) before the first profile; on a CUDA device it leaves it alone.
    """
    if torch.device(device).type != "cuda":
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")


def activities(device: str | torch.device) -> list:
    """The profiler activities for ``device``: the CPU always, CUDA kernels on a CUDA GPU (notebook 09)."""
    device = torch.device(device)
    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])


@contextmanager
def phase(name: str, device: torch.device, times: dict):
    """Annotate a phase for the profiler, end it with a device synchronisation, and time it (ms) into ``times``.

    The synchronisation makes the host-side range cover the device's work for the phase (notebook 09).
    """
    with record_function(PHASE_PREFIX + name):
        t0 = time.perf_counter()
        yield
        synchronize(device)
        times[name] = (time.perf_counter() - t0) * 1e3


def annotated_step(model: nn.Module, optimizer, batches, device: torch.device, loss_fn=None, host_inputs=()) -> dict:
    """One training step from the iterator ``batches``, phase by phase; returns each phase's ms (notebooks 09, 10).

    A batch is ``(*inputs, target)``; the inputs numbered in ``host_inputs`` stay on the CPU (as in ``fit``).
    """
    loss_fn, times = loss_fn or nn.CrossEntropyLoss(), {}
    with phase("data wait", device, times):
        batch = next(batches)
    with phase("host to device", device, times):
        inputs, target = split_batch(batch, device, host_inputs)  # non_blocking copies, as fit makes them
    with phase("forward", device, times):
        loss = loss_fn(model(*inputs), target)
    with phase("backward", device, times):
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
    with phase("optimizer", device, times):
        optimizer.step()
    return times


def forever(loader):
    """Batches from ``loader``, epoch after epoch (a fresh iterator each epoch, unlike ``itertools.cycle``);
    a loader that yields nothing in a pass is an error, not an endless loop (notebooks 09, 10)."""
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            raise ValueError("the loader yielded no batch: it must be iterable again, epoch after epoch "
                             "(a DataLoader or a list of batches, not a one-shot iterator)")


@dataclass
class ProfileRun:
    """What ``profile_training`` measured: the trace file, the profiler (for its table), per-step clock times.
    (notebook 09)"""

    trace: Path | None
    profiler: object | None
    clock_ms: list = field(default_factory=list)   # one {phase: ms} dict per recorded step
    step_ms: list = field(default_factory=list)    # wall time per recorded step (host clock, synchronised)


def profile_training(model: nn.Module, loader, device: str | torch.device, *, optimizer, loss_fn=None,
                     wait: int = 1, warmup: int = 1, active: int = 3, trace: str | Path | None = None,
                     profile_memory: bool = False, enabled: bool = True) -> ProfileRun:
    """Train ``wait + warmup + active`` steps from ``loader`` under ``torch.profiler``, phases annotated (notebook 09).

    The profiler skips ``wait`` steps (the loader's workers start), warms up for ``warmup`` and records
    ``active``; the trace of those is written to ``trace`` (open it in https://ui.perfetto.dev). With
    ``enabled=False`` the same steps run without the profiler, timed by the synchronised clock alone.
    """
    device = torch.device(device)
    model.to(device).train()
    batches, run = forever(loader), ProfileRun(None, None)
    quiet_profiler(device)
    prof = profile(activities=activities(device), schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
                   profile_memory=profile_memory) if enabled else None
    with prof if prof is not None else nullcontext():
        for i in range(wait + warmup + active):
            t0 = time.perf_counter()
            times = annotated_step(model, optimizer, batches, device, loss_fn)
            if i >= wait + warmup:
                run.clock_ms.append(times)
                run.step_ms.append((time.perf_counter() - t0) * 1e3)
            if prof is not None:
                prof.step()
    if prof is not None and trace is not None:
        Path(trace).parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(trace))
        run.trace = Path(trace)
    run.profiler = prof
    return run


def load_trace(trace) -> list:
    """The events of a Chrome/Perfetto trace: a path to the JSON file, or the list itself (notebook 09)."""
    if isinstance(trace, (str, Path)):
        return json.loads(Path(trace).read_text())["traceEvents"]
    return list(trace)


def _spans(events: list, prefix: str) -> list:
    return sorted(((e["ts"], e["ts"] + e["dur"], e["name"]) for e in events
                   if e.get("cat") == "user_annotation" and e.get("ph") == "X" and e.get("name", "").startswith(prefix)))


def _outer_ops(events: list) -> list:
    """(start, end) of CPU operators not called by another operator: their union is the time spent inside PyTorch's
    operators; the rest of a phase is Python and the framework around them (on a CPU, the "launch" overhead)."""
    ops = sorted((e.get("tid"), e["ts"], e["ts"] + e["dur"]) for e in events
                 if e.get("cat") == "cpu_op" and e.get("ph") == "X")
    outer = []
    for tid, start, end in ops:
        if outer and outer[-1][0] == tid and start < outer[-1][2]:
            outer[-1][2] = max(outer[-1][2], end)  # nested in (or overlapping) the previous outer operator
        else:
            outer.append([tid, start, end])
    return [(start, end) for _, start, end in outer]


def _busy_in(intervals: list, windows: list) -> float:
    """Total length of ``intervals`` that start inside one of ``windows`` (µs)."""
    return sum(end - start for start, end in intervals if any(a <= start < b for a, b in windows))


@dataclass
class StepPhases:
    """Mean time per step of each phase, read from a trace; ``busy_ms``: device work inside the compute phases.
    (notebook 09)"""

    phase_ms: dict            # phase -> ms per step (mean over the recorded steps), with "other" = the rest
    step_ms: float            # mean step time (ms), the sum of phase_ms
    steps: int
    busy_ms: float | None     # GPU kernels (on a CPU: time inside operators) in forward + backward + optimizer
    busy_source: str

    def state_dict(self) -> dict:
        return dict(self.__dict__)


def step_phases(trace) -> StepPhases:
    """Split each recorded step of a ``profile_training`` trace into its phases (ms per step, notebook 09).

    Steps are the profiler's ``ProfilerStep#N`` ranges; phases the ``phase/…`` ranges inside them; "other" is
    what no phase covers (the loop itself, the profiler's step bookkeeping). Device busy time counts GPU
    kernels and copies when the trace has them, else the time inside PyTorch's operators on the CPU.
    """
    events = load_trace(trace)
    steps, phases = _spans(events, "ProfilerStep#"), _spans(events, PHASE_PREFIX)
    if not steps:
        raise ValueError("no ProfilerStep ranges in this trace: call prof.step() after every step")
    totals = {p: 0.0 for p in PHASES}
    compute = []
    for a, b, name in phases:
        if any(s <= a < e for s, e, _ in steps):
            key = name[len(PHASE_PREFIX):]
            totals[key] = totals.get(key, 0.0) + (b - a)
            if key in ("forward", "backward", "optimizer"):
                compute.append((a, b))
    n, step_total = len(steps), sum(e - s for s, e, _ in steps)
    phase_ms = {k: v / n / 1e3 for k, v in totals.items()}
    phase_ms["other"] = max(0.0, step_total / n / 1e3 - sum(phase_ms.values()))
    kernels = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") in GPU_KERNEL_CATEGORIES]
    source = "GPU kernels and copies" if kernels else "time inside PyTorch operators (CPU)"
    busy = _busy_in(kernels if kernels else _outer_ops(events), compute) / n / 1e3
    return StepPhases(phase_ms, sum(phase_ms.values()), n, busy, source)


@dataclass
class Verdict:
    """What bounds a training step (a name of ``helpers.step.BOUNDS``), why (from the numbers), and its fix
    (notebook 09)."""

    bound: str
    reason: str
    fix: str


def input_or_transfer(wait_ms: float, copy_ms: float) -> str:
    """An input-bound step is transfer-bound when copying takes longer than waiting (notebooks 09 and 10)."""
    return "transfer" if copy_ms > wait_ms else "input"


def floor_bound(shares: dict, of: str = "the step") -> tuple[str, str]:
    """The bound a step's floors name, and why (notebooks 09 and 10): ``shares`` of the measured time (``of``) that
    each of ``predictions.predict_step``'s floors takes. The largest names it, unless all are under ``FLOOR_FAR``:
    then overhead: costs the operator count does not see, or kernels far below this machine's ceilings."""
    top = max(shares, key=shares.get)
    told = ", ".join(f"{k} {v:.0%}" for k, v in sorted(shares.items(), key=lambda kv: -kv[1]))
    if shares[top] < FLOOR_FAR:
        return "overhead", (f"the largest floor is only {shares[top]:.0%} of {of} ({told}): fixed costs the "
                            "operator count does not see (work inside fused operators, Python between them), or "
                            "kernels far below this machine's ceilings")
    how = "explains" if shares[top] >= FLOOR_EXPLAINS else "is the closest, at"
    return top, f"the {top} floor {how} {shares[top]:.0%} of {of} ({told})"


def verdict(phase_ms: dict, busy_ms: float | None = None, *, floors_ms: dict | None = None) -> Verdict:
    """Name the bound of a step from its phases (ms), the device's busy time and its floors (notebook 09).

    Input or transfer: data wait + host→device copy take ``INPUT_BOUND_SHARE`` of the step or more. Otherwise
    overhead: the device is busy less than ``OVERHEAD_BOUND_BUSY`` of the compute phases (a CPU counts each
    operator's dispatch as busy: there the overhead floor shows it). Otherwise ``floor_bound`` of ``floors_ms``
    (``predict_step``'s overhead, compute and memory, in ms) against the compute phases, as
    ``helpers.diagnose.classify`` does; without floors (or with none counted), compute, others not ruled out."""
    step = sum(phase_ms.values())
    if step <= 0:
        raise ValueError("the phases add up to no time at all")
    if floors_ms is not None and not {"overhead", "compute", "memory"} <= set(floors_ms):
        raise ValueError("floors_ms needs the overhead, compute and memory floors (ms) of predictions.predict_step")
    wait, moved = phase_ms.get("data wait", 0.0), phase_ms.get("host to device", 0.0)
    compute = sum(phase_ms.get(k, 0.0) for k in ("forward", "backward", "optimizer"))
    busy = busy_ms / compute if busy_ms is not None and compute > 0 else None
    if (wait + moved) / step >= INPUT_BOUND_SHARE:
        bound = input_or_transfer(wait, moved)
        why = (f"waiting for the batch ({wait:.3g} ms) and copying it ({moved:.3g} ms) take "
               f"{(wait + moved) / step:.0%} of the step")
    elif busy is not None and busy < OVERHEAD_BOUND_BUSY:
        bound, why = "overhead", f"the device is busy for only {busy:.0%} of the forward, backward and optimizer time"
    else:
        said = f"forward, backward and optimizer take {compute / step:.0%} of the step" + (
            f", the device busy {busy:.0%} of that time" if busy is not None else "")
        shares = {k: floors_ms[k] / compute for k in ("overhead", "compute", "memory")} if floors_ms and compute else {}
        if max(shares.values(), default=0) > 0:  # a floor was counted
            bound, why = floor_bound(shares, of="that time")
            why = f"{said}; {why}"
        else:
            unknown = " and ".join(["overhead"] * (busy is None) + ["memory"])
            bound, why = "compute", f"{said}; {unknown} not ruled out (pass busy_ms and counted floors_ms)"
    return Verdict(bound, why, BOUNDS[bound][0])


# ---------------------------------------------------------------- memory

def tensor_mb(*objects) -> float:
    """MB held by tensors, and by the tensors of modules (parameters, gradients, buffers) and optimizers (state)
    (notebook 09).

    Sharded (DTensor) parameters count their local shard only: what this process holds.
    """
    seen, total = set(), 0

    def add(t):
        nonlocal total
        t = t.to_local() if hasattr(t, "to_local") else t
        if torch.is_tensor(t) and t.untyped_storage().data_ptr() not in seen:
            seen.add(t.untyped_storage().data_ptr())
            total += t.untyped_storage().nbytes()

    for obj in objects:
        if torch.is_tensor(obj):
            add(obj)
        elif isinstance(obj, nn.Module):
            for t in [*obj.parameters(), *obj.buffers()]:
                add(t)
                if getattr(t, "grad", None) is not None:
                    add(t.grad)
        elif isinstance(obj, torch.optim.Optimizer):
            for state in obj.state.values():
                for v in state.values():
                    if torch.is_tensor(v) and v.dim() > 0:
                        add(v)
    return total / 2**20


def memory_source(device: str | torch.device) -> str:
    """What ``step_peak_mb`` measures on ``device``, for labels (notebook 09)."""
    kind = torch.device(device).type
    return {"cuda": "model, optimizer and batch tensors + peak of the step's allocations "
                    "(torch.cuda.max_memory_allocated)",
            "mps": "model, optimizer and batch tensors + growth of the Metal driver's allocation (no peak counter)"}.get(
        kind, "profiler memory view: model, optimizer and batch tensors + peak of the tensors allocated during the "
              "step (CPU, no CUDA counters)")


def trace_peak_mb(trace) -> float:
    """Peak MB of CPU tensors allocated and not yet freed during a trace, from its ``[memory]`` events; what existed
    before profiling started is not in it (add ``tensor_mb`` for a whole-process figure) (notebook 09)."""
    events = sorted((e["ts"], e["args"]["Bytes"]) for e in load_trace(trace)
                    if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type", 0) == 0)  # 0: the CPU
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak / 2**20


def _profiler_peak_mb(fn: Callable[[], object]) -> float:
    """Peak MB of CPU tensors allocated (and not yet freed) while ``fn()`` runs, from the profiler (notebook 09)."""
    import tempfile

    quiet_profiler(torch.device("cpu"))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    with tempfile.TemporaryDirectory() as tmp:
        prof.export_chrome_trace(str(Path(tmp) / "memory.json"))
        return trace_peak_mb(Path(tmp) / "memory.json")


def peak_mb(fn: Callable[[], object], device: str | torch.device, held=()) -> float:
    """The course's one measure of memory (notebooks 09, 11): the peak MB ``fn()`` allocates beyond what existed
    before it, plus the tensors of ``held`` (modules and optimizers: ``tensor_mb``) that existed already.

    On CUDA: ``max_memory_allocated`` after ``reset_peak_memory_stats``, less what was allocated before. On an
    Apple GPU, which has no peak counter: how much the Metal driver's allocation grows from an emptied cache (the
    blocks ``fn`` needed, which the cache then holds). On a CPU: the profiler's peak of what ``fn`` allocates.
    """
    device, held_mb = torch.device(device), tensor_mb(*held)  # before fn: what it leaves (gradients) is its own
    if device.type == "cuda":
        synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        synchronize(device)
        grown = (torch.cuda.max_memory_allocated(device) - before) / 2**20
    elif device.type == "mps":
        torch.mps.synchronize()
        torch.mps.empty_cache()
        before = torch.mps.driver_allocated_memory()
        fn()
        torch.mps.synchronize()
        grown = (torch.mps.driver_allocated_memory() - before) / 2**20
    else:
        grown = _profiler_peak_mb(fn)
    return held_mb + grown


def step_peak_mb(model: nn.Module, optimizer, batch_size: int, device: str | torch.device, *,
                 make_batch: Callable[[int], tuple] | None = None, loss_fn=None, amp=False,
                 channels_last: bool = False) -> float:
    """Peak memory (MB) of one training step at ``batch_size`` (notebooks 06, 09): ``peak_mb`` of the course's step
    (``helpers.step.train_step``, its precision and ``channels_last`` included), with the model's, the optimizer's
    and the batch's tensors held. ``make_batch(n)`` defaults to CIFAR-sized random images.
    """
    make_batch = make_batch or (lambda n: (torch.randn(n, 3, 32, 32), torch.randint(0, 10, (n,))))
    step = train_step(model, optimizer, make_batch(batch_size), device, loss_fn=loss_fn, amp=amp,
                      channels_last=channels_last)
    step.optimizer.zero_grad(set_to_none=True)
    return peak_mb(step, step.device, held=(step.model, step.optimizer, *step.inputs, step.target))


def out_of_memory(err: BaseException) -> bool:
    """True when ``err`` says a device ran out of memory: CUDA's ``torch.OutOfMemoryError``, or the plain
    ``RuntimeError`` Apple's MPS backend raises ("MPS backend out of memory") (notebooks 09, 10)."""
    return isinstance(err, torch.OutOfMemoryError) or (
        isinstance(err, RuntimeError) and "MPS backend out of memory" in str(err))


def free_memory(device: str | torch.device) -> None:
    """Give freed memory back after an out-of-memory error: collect garbage, empty the CUDA cache (notebook 09)."""
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
    elif torch.device(device).type == "mps":
        torch.mps.empty_cache()


def planted_limit(measure: Callable[[int], float], limit_mb: float) -> Callable[[int], float]:
    """``measure(batch) -> peak MB``, but raising ``torch.OutOfMemoryError`` above ``limit_mb`` (notebook 09).

    Stands in for a device of ``limit_mb`` MB, so that an out-of-memory search really meets the error and
    really recovers from it on a machine with memory to spare (a CPU). The step runs, then is judged.
    """
    def measure_within_limit(batch: int) -> float:
        peak = measure(batch)
        if peak > limit_mb:
            raise torch.OutOfMemoryError(f"planted limit: batch {batch} needs {peak:.0f} MB, the limit is "
                                         f"{limit_mb:.0f} MB")
        return peak

    return measure_within_limit


@contextmanager
def memory_budget(device: str | torch.device, limit_mb: float | None):
    """On CUDA, let the caching allocator use at most ``limit_mb`` MB (real OOM errors above it) (notebook 09).

    ``torch.cuda.set_per_process_memory_fraction``, restored to the whole device afterwards. Elsewhere, and
    with ``limit_mb=None``, it does nothing.
    """
    device = torch.device(device)
    if device.type != "cuda" or limit_mb is None:
        yield
        return
    total = torch.cuda.get_device_properties(device).total_memory
    free_memory(device)  # blocks an earlier search cached would bypass the limit: the fraction caps new requests
    torch.cuda.set_per_process_memory_fraction(min(1.0, limit_mb * 2**20 / total), device)
    try:
        yield
    finally:
        free_memory(device)
        torch.cuda.set_per_process_memory_fraction(1.0, device)


def find_max_batch(measure: Callable[[int], float], *, start: int = 8, cap: int | None = None,
                   resolution: float = 0.05, device: str | torch.device = "cpu", deadline: float | None = None,
                   min_trials: int = 3, log: Callable[[str], None] = print) -> dict:
    """The largest batch whose step fits: double until out of memory, then bisect, recovering each time (notebook 09).

    ``measure(batch)`` runs a step and returns its peak MB, raising ``torch.OutOfMemoryError`` when it does not fit
    (the real CUDA error, or ``planted_limit``'s). Bisection stops when the gap is within ``resolution`` of the
    batch; ``cap`` bounds the batch and ``deadline`` (a ``time.monotonic()`` value) the search time, though never
    before ``min_trials`` trials (a search that starts late still finds something).
    """
    trials = {}

    def fits(batch: int) -> bool:
        try:
            trials[batch] = measure(batch)
            return True
        except RuntimeError as err:  # only running out of memory: anything else is a bug to see
            if not out_of_memory(err):
                raise
            trials[batch], message = None, str(err).splitlines()[0][:140]
            what = "torch.OutOfMemoryError" if isinstance(err, torch.OutOfMemoryError) else "out of memory"
        free_memory(device)  # after the except block: the traceback no longer holds the step's tensors
        log(f"batch {batch}: {what} ({message}) — recovered, searching lower")
        return False

    def late() -> bool:
        return deadline is not None and time.monotonic() > deadline and len(trials) >= min_trials

    lo, hi, batch, stopped = 0, None, start, None
    while hi is None and stopped is None:
        if late():
            stopped = "time"
        elif not fits(batch):
            hi = batch
        elif cap is not None and batch >= cap:
            lo, stopped = batch, "cap"
        else:
            lo, batch = batch, batch * 2 if cap is None else min(batch * 2, cap)
    while hi is not None and hi - lo > max(1, int(resolution * lo)) and stopped is None:
        mid = (lo + hi) // 2
        if late():
            stopped = "time"
        elif fits(mid):
            lo = mid
        else:
            hi = mid
    return {"max_batch": lo, "first_oom": hi, "trials": trials,  # in the order they were tried
            "ooms": sum(v is None for v in trials.values()), "stopped": stopped}


# ---------------------------------------------------------------- activation checkpointing

def checkpoint_segments(features: nn.Sequential, segments: int) -> list:
    """Split a stack of layers into ``segments`` runs of whole layers, cutting only after a ReLU or a pooling layer.

    A segment must not begin with an in-place ReLU: it would overwrite the segment's input, which is exactly what
    checkpointing saves for the recomputation (autograd then stops with "modified by an inplace operation";
    ``checkpoint_sequential`` cuts at equal counts of layers and can do that) (notebook 09).
    """
    units, current = [], []
    for layer in features:
        current.append(layer)
        if isinstance(layer, (nn.ReLU, nn.MaxPool2d, nn.AvgPool2d)):
            units.append(current)
            current = []
    units += [current] if current else []
    segments = max(1, min(segments, len(units)))
    bounds = [round(i * len(units) / segments) for i in range(segments + 1)]
    return [nn.Sequential(*[layer for unit in units[a:b] for layer in unit]) for a, b in zip(bounds, bounds[1:])]


class Checkpointed(nn.Module):
    """A ``ConvBlockNet``-shaped model whose ``features`` run under activation checkpointing (notebook 09).

    ``torch.utils.checkpoint.checkpoint`` keeps only each segment's input during the forward pass and recomputes
    the segment's activations in the backward pass: less memory, up to one more forward pass of time. The last
    segment is not checkpointed (its activations are needed at once). The recomputation runs BatchNorm layers
    again, so their running statistics are updated twice per step.
    """

    def __init__(self, model: nn.Module, segments: int):
        super().__init__()
        self.model, self.segments = model, segments
        self._chunks = checkpoint_segments(model.features, segments)  # a plain list: the layers stay model's

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and torch.is_grad_enabled():
            for chunk in self._chunks[:-1]:
                x = checkpoint(chunk, x, use_reentrant=False)
            features = self._chunks[-1](x)
        else:
            features = self.model.features(x)
        return self.model.head(features.mean(dim=(2, 3)))


def checkpointing_tradeoff(make_model: Callable[[], nn.Module], batch_size: int, device: str | torch.device, *,
                           segments: int = 4, min_run_time: float = 0.3, rounds: int = 3) -> dict:
    """Peak memory and step time of a model with and without activation checkpointing, and the ratios (notebook 09).

    The two step times are measured in ``rounds`` alternating rounds and their medians kept, so that a machine
    whose speed drifts (a shared CPU) does not favour whichever ran second.
    """
    runs = {}
    for name in ("plain", "checkpointed"):
        torch.manual_seed(0)
        model = make_model()
        model = Checkpointed(model, segments) if name == "checkpointed" else model
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        runs[name] = (model, opt, step_peak_mb(model, opt, batch_size, device))
    batch = (torch.randn(batch_size, 3, 32, 32), torch.randint(0, 10, (batch_size,)))
    times = {name: [] for name in runs}
    for _ in range(rounds):
        for name, (model, opt, _) in runs.items():
            t = time_train_step(model, batch, device, optimizer=opt, warmup=1, min_run_time=min_run_time, label=name)
            times[name].append(t.median_s * 1e3)
    found = {name: {"peak_mb": runs[name][2], "step_ms": statistics.median(times[name]), "step_ms_rounds": times[name]}
             for name in runs}
    found["memory_ratio"] = found["checkpointed"]["peak_mb"] / found["plain"]["peak_mb"]
    found["time_ratio"] = found["checkpointed"]["step_ms"] / found["plain"]["step_ms"]
    return found


def linear_fit(points: dict) -> tuple[float, float]:
    """Least-squares ``y = a + b x`` through ``{x: y}``: (intercept, slope), e.g. fixed MB and MB per image (notebook 09)."""
    slope, intercept = statistics.linear_regression([float(x) for x in points], [float(y) for y in points.values()])
    return intercept, slope
