"""Diagnose a training step: what holds it back, and which of the course's levers helps, measured (notebook 10).

    diagnose(model, loader, loss_fn, optimizer, device="auto", budget_s=60) -> Diagnosis
    python -m helpers.diagnose my_training.py [--device D] [--budget-s S] [--levers compile] [--json]

It works on copies of the learner's model and optimizer, and leaves the global random generators as they were. It
measures the real step, the model alone and the input alone (``_core``), the step's floors (``_floors``) and each
lever against its baseline in paired, interleaved rounds (``compare``, ``recommend``).
"""
from __future__ import annotations

import argparse
import copy
import json
import runpy
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from .ceilings import main_dtype, measured_ceilings, mfu
from .cifar10 import FileImageDataset
from .compiling import require_compiler
from .counting import count_step
from .devices import loader_workers, pick_device, synchronize, usable_cpus
from .predictions import predict_step
from .profiling import (FLOOR_EXPLAINS, INPUT_BOUND_SHARE, annotated_step, floor_bound, forever, free_memory,
                        input_or_transfer, out_of_memory, peak_mb)
from .step import BOUNDS, channels_last_batch, resolve_amp, split_batch, train_step
from .training import rng_state, set_rng_state

LESSON = {"threads": "01 and 02", "workers": "04", "decoded": "10", "pinned": "03", "amp": "06",
          "channels_last": "06", "batch": "05 and 09", "compile": "08"}
CAVEAT = {"amp": "lower precision: check the accuracy (lesson 06)",
          "batch": "a larger batch changes training: scale the learning rate (linear rule, lesson 05) and check "
                   "the accuracy",
          "compile": "pays back only after the break-even number of steps",
          "decoded": "keeps every decoded image in memory",
          "threads": "other programs hold some of the cores now: measure again when they stop"}
SIDE = {"threads": "step", "workers": "input", "decoded": "input", "pinned": "input", "amp": "model",
        "channels_last": "model", "batch": "model", "compile": "model"}
OVERHEAD_GAIN = 4 / 3   # twice the batch gives this many times the items/s or more: a fixed cost is half the step
NOISY = 0.25            # steps varying more than this (± share): the report says the machine was busy
WORTH = 1.05            # a lever is recommended when the lower end of its interval is above this
MIN_PAIRS, MAX_PAIRS = 5, 15  # paired rounds per comparison: fewer than MIN_PAIRS is "not measured (budget)"
BUDGET = "not measured (budget)"


@dataclass
class Diagnosis:
    """What ``diagnose`` measured, as plain data (``to_dict`` for JSON) and as a report (``markdown``) (notebook 10)."""

    device: str
    batch_size: int
    bottleneck: str
    reason: str
    phase_ms: dict
    input_items_per_s: float = 0.0
    model_items_per_s: float = 0.0
    real_items_per_s: float = 0.0
    overlap: dict = field(default_factory=dict)     # serial (input + model alone) vs the real step, per batch
    noise: dict = field(default_factory=dict)       # ± half the 10th-90th percentile spread of each rate, a share
    floors: dict = field(default_factory=dict)      # overhead / compute / memory seconds, shares, MFU
    levers: dict = field(default_factory=dict)      # lever -> speed-up, interval, pairs, step speed-up, cap, what
    not_measured: dict = field(default_factory=dict)  # lever -> why not
    recommendations: list = field(default_factory=list)  # ranked by the lower end of the step speed-up
    advice: list = field(default_factory=list)      # what else to try, for input-bound steps
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)

    def markdown(self) -> str:
        """The report: the verdict with its numbers, the measurements, the lever table, what to change first."""
        lessons = BOUNDS[self.bottleneck][1] if self.bottleneck in BOUNDS else "lesson 09"  # or out of memory
        head = f"**Bottleneck: {self.bottleneck}** — {self.reason} ({lessons})."
        if self.bottleneck == "out of memory":
            return (f"{head}\n\nNothing else was measured. Lesson 09's levers: a smaller batch, activation "
                    "checkpointing, mixed precision, sharding the model (FSDP2).\n\n"
                    f"(diagnosis took {self.seconds:.0f} s)")
        return "\n".join([head, "", *_measurements(self), "", *_lever_table(self), *(
            f"- {a}" for a in self.advice)]) + f"\n\n(diagnosis took {self.seconds:.0f} s)"


def _measurements(d: Diagnosis) -> list:
    o, f, t = d.overlap, d.floors, d.levers.get("threads")
    lines = [f"With {t['threads']} torch thread(s) the step ran {t['speedup']:.2f}× as fast in the median "
             f"({t['low']:.2f}–{t['high']:.2f}), so the measurements below used {t['threads']}."
             for _ in [0] if _clearly_faster(t)]
    busy = max(d.noise.get("real step", 0), d.noise.get("model alone", 0))
    lines += [f"The machine was busy: steps varied up to ±{busy:.0%}, so the intervals are wide; measure again when "
              "it is quieter." for _ in [0] if busy > NOISY]
    lines += [f"Device `{d.device}`, batch {d.batch_size}. Items/s: real step {d.real_items_per_s:,.0f}, model "
             f"alone {d.model_items_per_s:,.0f}, input alone {d.input_items_per_s:,.0f}; steps varied "
             f"±{100 * d.noise.get('real step', 0):.0f} % (real) and ±{100 * d.noise.get('model alone', 0):.0f} % "
             "(model alone).",
             f"Per batch: input alone {o['input_ms']:.1f} ms + model alone {o['model_ms']:.1f} ms = "
             f"{o['serial_ms']:.1f} ms in series; the real step takes {o['real_ms']:.1f} ms, so "
             + (f"{o['hidden']:.0%} of the serial time is hidden by overlap" if o["hidden"] >= 0.005 else
                "no time is hidden by overlap" + (f" (the real step took {-o['hidden']:.0%} longer than the two in "
                                                  "series: the rounds varied)" if o["hidden"] <= -0.005 else ""))
             + ". Phases, synchronised after each (ms): "
             + ", ".join(f"{k} {v:.1f}" for k, v in d.phase_ms.items())
             + f" = {o['phases_ms']:.1f} (data wait + copy: {o['input_phase_share']:.0%} of the synchronised step)."]
    if f.get("step_s"):
        lines.append(f"Floors for the model's step of {1e3 * f['step_s']:.1f} ms: overhead {f['ops']} operators × "
                     f"{1e6 * f['op_s']:.1f} µs = {1e3 * f['overhead_s']:.2f} ms ({f['shares']['overhead']:.0%}), "
                     f"compute {f['flops'] / 1e9:.3g} GFLOP at {f['peak_flops_per_s'] / 1e9:,.0f} GFLOP/s = "
                     f"{1e3 * f['compute_s']:.2f} ms ({f['shares']['compute']:.0%}), memory {f['bytes'] / 1e6:,.0f} "
                     f"MB at {f['bytes_per_s'] / 1e9:.0f} GB/s = {1e3 * f['memory_s']:.2f} ms "
                     f"({f['shares']['memory']:.0%}). MFU {f['mfu_real']:.1%} in the real step, "
                     f"{f['mfu_model']:.1%} for the model alone ({f['peak']}, {f['dtype']}).")
    elif f.get("error"):
        lines.append(f"Floors not counted: {f['error']}")
    return lines


def _lever_table(d: Diagnosis) -> list:
    rows = ["| lever | step speed-up | interval (10th–90th %) | measured | pairs | recommended | lesson |",
            "|---|---|---|---|---|---|---|"]
    chosen = {r["lever"] for r in d.recommendations}
    for k, v in sorted(d.levers.items(), key=lambda kv: -kv[1]["step_low"]):
        cap = f", capped at {v['cap']:.2f}×" if v.get("capped") else ""
        rows.append(f"| {k}: {v['what']} | {v['step_speedup']:.2f}× | {v['step_low']:.2f}–{v['step_high']:.2f}× | "
                    f"{v['speedup']:.2f}× ({v['low']:.2f}–{v['high']:.2f}) on the {v['measured_on']}{cap} | "
                    f"{v['pairs']} | {'**yes**' if k in chosen else 'no'} | {LESSON[k]} |")
    rows += [f"| {k} | | | {why} | | no | {LESSON.get(k, '')} |" for k, why in d.not_measured.items()]
    first = [f"Change first: **{r['lever']}** ({r['what']}): {r['step_speedup']:.2f}× the step "
             f"({r['step_low']:.2f}–{r['step_high']:.2f}); caveat: {r['caveat']}." for r in d.recommendations[:1]]
    return rows + [""] + (first or [f"Nothing measured speeds the step up beyond its noise (lower end above "
                                    f"{WORTH:.2f}×)."])


@contextmanager
def _untouched(model: nn.Module, optimizer):
    """Copies of model and optimizer to measure with (the optimizer keeps pointing at the copy's parameters);
    the RNG states are restored afterwards, so the learner's run continues as if nothing happened."""
    rng = rng_state()
    work_model, work_opt = copy.deepcopy((model, optimizer))
    # An LR scheduler patches optimizer.step with a closure over the *original* optimizer; Optimizer.__getstate__
    # leaves that patch out of the copy, so the copy steps its own parameters (a test holds torch to it).
    try:
        yield work_model, work_opt
    finally:
        set_rng_state(rng)


def _items(batch) -> int:
    return int(batch[-1].shape[0])


def _check_batch(batch) -> None:
    if not isinstance(batch, (tuple, list)) or len(batch) < 2 or not isinstance(batch[-1], torch.Tensor):
        raise ValueError(f"each batch must be (*inputs, target) with a tensor target, as fit() takes; this loader "
                         f"yields a {type(batch).__name__}: wrap it (e.g. a generator yielding (x, y)) first")


def _first_batches(loader, most: int = 16, mb: float = 256) -> list:
    """The loader's first batches (``most`` at most, ``mb`` MB together at most; one at least), checked."""
    found, size = [], 0
    for batch in loader:
        _check_batch(batch)
        found.append(batch)
        size += sum(x.nbytes for x in batch if isinstance(x, torch.Tensor)) / 2**20
        if len(found) >= most or size >= mb:
            break
    if not found:
        raise ValueError("the loader yielded no batch")
    return found


def _fits(run, device, memory_limit_mb: float | None) -> str | None:
    """None if ``run()`` fits (on CUDA: no OutOfMemoryError; elsewhere: the CPU peak under ``memory_limit_mb``),
    else the reason. The check measures the peak (``peak_mb``: the profiler's on a CPU), so a planted limit is met
    for real."""
    try:
        if memory_limit_mb is not None and device.type != "cuda":
            peak = peak_mb(run, device)  # the course's one measure of memory (lesson 09)
            if peak > memory_limit_mb:
                return f"needs {peak:.0f} MB, over the {memory_limit_mb:.0f} MB limit"
        else:
            run()
    except RuntimeError as exc:  # CUDA's OutOfMemoryError, or the RuntimeError of MPS; anything else is raised
        if not out_of_memory(exc):
            raise
        free_memory(device)
        return f"out of memory ({str(exc).splitlines()[0][:100]})"
    return None


# ---------------------------------------------------------------- paired, interleaved measurement

@dataclass
class _Side:
    """One configuration to time: ``run(n)`` takes ``n`` steps, synchronised at the end, and returns (seconds,
    items); ``skip`` untimed steps come before each timed chunk (the batches a loader's workers prefetched while
    the other side ran would otherwise come free)."""

    run: Callable[[int], tuple]
    skip: int = 0
    n: int = 1
    step_s: float = 0.0

    def chunk(self) -> float:
        if self.skip:
            self.run(self.skip)
        seconds, items = self.run(self.n)
        return items / seconds

    @property
    def cost(self) -> float:
        return (self.n + self.skip) * self.step_s


def _prepare(side: _Side, chunk_s: float) -> _Side:
    """Warm ``side`` up (first-call costs: allocation, compilation, worker start-up) and size its chunk to about
    ``chunk_s`` seconds of steps (one step at least)."""
    seconds = side.run(1)[0]
    if seconds < chunk_s:  # the first step may pay for more than a step: time one again (slow ones are chunks)
        seconds = side.run(1)[0]
    if seconds < chunk_s / 20:  # a short step: estimate it over several
        m = max(2, int(chunk_s / 10 / max(seconds, 1e-7)))
        seconds = side.run(m)[0] / m
    side.step_s, side.n = seconds, max(1, round(chunk_s / seconds))
    return side


def _interleave(sides: list, rounds: int, deadline: float) -> list:
    """``rounds`` rounds of one chunk per side, the order reversed every other round (A B, B A, ...), so drift
    and a neighbour's load fall on every side alike; stops early past ``deadline`` once ``MIN_PAIRS`` are done.
    Returns the items/s of each chunk, per side."""
    rates = [[] for _ in sides]
    for r in range(rounds):
        for i in (range(len(sides)) if r % 2 == 0 else reversed(range(len(sides)))):
            rates[i].append(sides[i].chunk())
        if r + 1 >= MIN_PAIRS and time.perf_counter() > deadline:
            break
    return rates


def interval(ratios: list) -> dict:
    """Median and 10th-90th percentile of paired ratios (notebook 10)."""
    ratios = sorted(ratios)
    q = statistics.quantiles(ratios, n=10, method="inclusive") if len(ratios) > 1 else [ratios[0]] * 9
    return {"speedup": statistics.median(ratios), "low": q[0], "high": q[-1], "pairs": len(ratios)}


def noise(rates: list) -> float:
    """How much repeated measurements of one rate varied: half their 10th-90th percentile spread over the median
    (notebook 10)."""
    got = interval(rates)
    return (got["high"] - got["low"]) / 2 / got["speedup"]


class _Bench:
    """The shared context of one diagnosis: the work copies, the loader's first batches (on the device for the
    model alone, which steps through them in turn, so a loader whose batches differ, e.g. in sequence length, is
    timed on a mix), the device, the time left."""

    def __init__(self, model, optimizer, loader, batches, device, loss_fn, host_inputs, deadline, chunk_s):
        self.model, self.optimizer, self.loader, self.device = model, optimizer, loader, device
        self.host_batch = batches[0]
        self.batches = [[*ins, t] for ins, t in (split_batch(x, device, host_inputs) for x in batches)]
        self.batch = self.batches[0]
        self.loss_fn, self.host_inputs, self.deadline, self.chunk_s = loss_fn, host_inputs, deadline, chunk_s
        self.rates: dict = {}  # real / model / input items/s, set by _core

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def model_side(self, batches=None, amp=None, channels_last=False, compiled=False) -> _Side:
        """The model alone on batches already on the device, in turn, on a fresh copy of model and optimizer."""
        step = train_step(self.model, self.optimizer, self.host_batch, self.device, loss_fn=self.loss_fn,
                          amp=amp or False, host_inputs=self.host_inputs, channels_last=channels_last, copy=True)
        batches = self.batches if batches is None else batches
        if channels_last:
            batches = [channels_last_batch(batch) for batch in batches]
        step.model = torch.compile(step.model) if compiled else step.model
        turn = iter(())

        def run(n):
            nonlocal turn
            t0, items = time.perf_counter(), 0
            for _ in range(n):
                batch = next(turn, None) or next(turn := iter(batches))
                step(batch)
                items += _items(batch)
            synchronize(self.device)
            return time.perf_counter() - t0, items
        return _Side(run)

    def real_side(self, loader=None, threads: int | None = None) -> _Side:
        """The real loop: batches from ``loader`` (default the learner's), copied and stepped, no sync inside;
        with ``threads`` torch threads (default: as set)."""
        loader = self.loader if loader is None else loader
        batches = forever(loader)
        step = train_step(self.model, self.optimizer, self.host_batch, self.device, loss_fn=self.loss_fn,
                          host_inputs=self.host_inputs, copy=True)

        def run(n):
            with _threads(threads):
                t0, items = time.perf_counter(), 0
                for _ in range(n):
                    batch = next(batches)
                    step(batch)
                    items += _items(batch)
                synchronize(self.device)
                return time.perf_counter() - t0, items
        return _Side(run, skip=_prefetched(loader))

    def input_side(self, loader) -> _Side:
        """The input pipeline alone: batches drawn and copied to the device, no model."""
        batches = forever(loader)

        def run(n):
            t0, items = time.perf_counter(), 0
            for _ in range(n):
                _, target = split_batch(next(batches), self.device, self.host_inputs)
                items += int(target.shape[0])
            synchronize(self.device)
            return time.perf_counter() - t0, items
        return _Side(run, skip=_prefetched(loader))

    def compare(self, make_base, make_other, share: float) -> dict | str:
        """``make_other()``'s items/s over ``make_base()``'s in paired rounds: as many as ``share`` seconds allow,
        ``MIN_PAIRS`` at least, or ``BUDGET`` (with the reason) when even those do not fit in the time left."""
        base, other = _prepare(make_base(), self.chunk_s), _prepare(make_other(), self.chunk_s)
        cost = base.cost + other.cost
        pairs = min(MAX_PAIRS, int(share / cost))
        if pairs < MIN_PAIRS and MIN_PAIRS * cost > self.left():
            return f"{BUDGET}: {MIN_PAIRS} pairs need about {MIN_PAIRS * cost:.1f} s, {max(self.left(), 0):.1f} s left"
        a, b = _interleave([base, other], max(pairs, MIN_PAIRS), self.deadline)
        return interval([y / x for x, y in zip(a, b)])


@contextmanager
def _threads(n: int | None):
    """torch's intra-op threads set to ``n`` inside (unchanged for None), restored after."""
    was = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(was)


def _prefetched(loader) -> int:
    """Batches a DataLoader's workers hold ready (workers × prefetch factor), 0 without workers."""
    workers = getattr(loader, "num_workers", 0)
    return workers * (getattr(loader, "prefetch_factor", None) or 2) if workers else 0


def _like(loader, **changes):
    """A DataLoader that batches exactly as ``loader`` does — its own dataset, sampler or batch sampler objects,
    collate, workers — with ``changes`` (what a lever needs); any other loader (a list of batches, a re-made
    generator, ``DeviceLoader``) as it is, which is safe to iterate again. A new DataLoader each time, so that two
    passes never share one set of persistent workers."""
    from torch.utils.data import DataLoader, IterableDataset

    if not isinstance(loader, DataLoader):
        return loader
    if isinstance(loader.dataset, IterableDataset):  # the stream batches itself, or by batch_size
        batching = dict(batch_size=loader.batch_size, drop_last=loader.drop_last)
    elif loader.batch_sampler is not None:  # batch_size=N (DataLoader made this BatchSampler) or a batch_sampler
        batching = dict(batch_sampler=loader.batch_sampler)
    else:  # batch_size=None: no automatic batching, the sampler's items go to the dataset as they are
        batching = dict(batch_size=None, sampler=loader.sampler)
    kw = dict(dataset=loader.dataset, collate_fn=loader.collate_fn, num_workers=loader.num_workers,
              pin_memory=loader.pin_memory, worker_init_fn=loader.worker_init_fn, generator=loader.generator,
              persistent_workers=loader.persistent_workers, prefetch_factor=loader.prefetch_factor,
              multiprocessing_context=loader.multiprocessing_context, **batching)
    kw.update(changes)
    if not kw["num_workers"]:
        kw.update(persistent_workers=False, prefetch_factor=None, multiprocessing_context=None)
    return DataLoader(**kw)


def loader_setting(loader) -> str:
    """How ``loader`` batches, in one phrase for an error line (``DataLoader(batch_size=None, sampler=BatchSampler,
    num_workers=0)``, ``a list of batches``) (notebook 10)."""
    from torch.utils.data import DataLoader, IterableDataset

    if not isinstance(loader, DataLoader):
        return "a re-made generator" if isinstance(loader, Remade) else f"a {type(loader).__name__} of batches"
    if isinstance(loader.dataset, IterableDataset):
        how = f"an IterableDataset, batch_size={loader.batch_size}"
    elif loader.batch_size is not None:  # DataLoader made the BatchSampler from batch_size
        how = f"batch_size={loader.batch_size}, sampler={type(loader.sampler).__name__}"
    elif loader.batch_sampler is None:
        how = f"batch_size=None, sampler={type(loader.sampler).__name__}"
    else:
        how = f"batch_sampler={type(loader.batch_sampler).__name__}"
    return f"DataLoader({how}, num_workers={loader.num_workers})"


class Remade:
    """A loader that a script makes anew for each pass (``make_loader()`` returning a generator or an iterator):
    every ``iter()`` calls the factory again, so each of diagnose's passes gets a fresh one (notebook 10)."""

    def __init__(self, make):
        self.make = make

    def __iter__(self):
        return iter(self.make())


# ---------------------------------------------------------------- what the step is, measured and counted

def _core(b: _Bench, budget_s: float, first_s: float) -> tuple[dict, dict, dict, dict]:
    """The phases (synchronised, lesson 09), then the real step, the model alone and the input alone in
    interleaved rounds. Returns phase ms, rates (items/s), their noise, and the overlap per batch."""
    model, opt = copy.deepcopy((b.model, b.optimizer))
    batches = forever(_like(b.loader))
    steps = int(min(10, max(3, 0.08 * budget_s / max(first_s, 1e-6))))
    rows = [annotated_step(model, opt, batches, b.device, b.loss_fn, b.host_inputs) for _ in range(steps + 1)][1:]
    phase_ms = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    del model, opt, batches
    sides = [_prepare(s, b.chunk_s) for s in (b.real_side(), b.model_side(), b.input_side(_like(b.loader)))]
    rounds = min(9, max(MIN_PAIRS, int(0.2 * budget_s / sum(s.cost for s in sides))))
    real, alone, inp = _interleave(sides, rounds, time.perf_counter() + 0.2 * budget_s)
    rates = {"real": statistics.median(real), "model": statistics.median(alone), "input": statistics.median(inp)}
    spread = {"real step": noise(real), "model alone": noise(alone), "input alone": noise(inp)}
    per_batch = {k: 1e3 * _items(b.batch) / rates[v] for k, v in (("input_ms", "input"), ("model_ms", "model"),
                                                                   ("real_ms", "real"))}
    serial = per_batch["input_ms"] + per_batch["model_ms"]
    phases = sum(phase_ms.values())
    overlap = {**per_batch, "serial_ms": serial, "hidden": 1 - per_batch["real_ms"] / serial, "phases_ms": phases,
               "input_phase_share": (phase_ms["data wait"] + phase_ms["host to device"]) / phases,
               "model_over_real": interval([m / r for r, m in zip(real, alone)])}
    return phase_ms, rates, spread, overlap


def _floors(b: _Bench, rates: dict) -> dict:
    """The model step's floors (``predictions.predict_step`` of ``counting.count_step`` on this machine's
    ``measured_ceilings``): operators × cost per operator, FLOPs at the matmul peak, bytes at the bandwidth; their
    shares of the model-alone step; the MFU of the real step and of the model alone against the measured peak."""
    try:
        work = count_step(b.model, b.host_batch, b.device, optimizer=b.optimizer, loss_fn=b.loss_fn,
                          host_inputs=b.host_inputs)
        ceilings = measured_ceilings(b.device)
        pred, dtype = predict_step(work, ceilings), main_dtype(work)
        got = mfu(work.flops * rates["model"] / work.items, b.device, dtype, ceilings=ceilings)
    except Exception as exc:  # an operator the counter cannot follow: the verdict falls back on batch scaling
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"}
    step_s = work.items / rates["model"]
    floors = {k: pred[f"{k}_s"] for k in ("overhead", "compute", "memory")}
    return {"step_s": step_s, **{f"{k}_s": v for k, v in floors.items()},
            "shares": {k: v / step_s for k, v in floors.items()}, "ops": work.ops, "op_s": ceilings["op_s"],
            "flops": work.flops, "bytes": work.bytes, "peak_flops_per_s": got["peak_flops_per_s"],
            "bytes_per_s": ceilings["bytes_per_s"], "intensity": work.flops / max(work.bytes, 1),
            "ridge": got["peak_flops_per_s"] / ceilings["bytes_per_s"], "dtype": dtype, "peak": got["peak"],
            "mfu_model": got["mfu"], "mfu_real": got["mfu"] * rates["real"] / rates["model"]}


def classify(rates: dict, phase_ms: dict, floors: dict | None = None, batch: dict | None = None) -> tuple[str, str]:
    """The bottleneck and its measured reason (notebook 10).

    ``rates``: items/s of the real step, the model alone and the input alone. Input (or transfer, when copying
    takes longer than waiting): the input alone is slower than the model alone, or the real step spends
    ``INPUT_BOUND_SHARE`` or more of its time outside the model and the synchronised phases agree (data wait and copy
    take at least half that share: a real step slowed by a busy machine is not an input-bound one). Otherwise
    overhead when no floor (``_floors``) explains ``FLOOR_EXPLAINS`` of the model's step and twice the batch gives
    ``OVERHEAD_GAIN``× the items/s at the lower end of its interval (``batch``: the paired batch lever); else
    ``profiling.floor_bound``, the rule ``profiling.verdict`` uses too. Batch scaling is otherwise corroboration only.
    """
    real, model, inp = rates["real"], rates["model"], rates["input"]
    outside = max(0.0, 1 - real / model)
    said = (f"the real step runs at {real:,.0f} items/s, the model alone at {model:,.0f} and the input alone at "
            f"{inp:,.0f}")
    wait, moved = phase_ms.get("data wait", 0.0), phase_ms.get("host to device", 0.0)
    waiting = (wait + moved) / (sum(phase_ms.values()) or 1)
    if inp < model or (outside >= INPUT_BOUND_SHARE and waiting >= INPUT_BOUND_SHARE / 2):
        why = (f"{outside:.0%} of the real step is spent outside the model" +
               (" and the input alone is the slower side" if inp < model else f" (≥ {INPUT_BOUND_SHARE:.0%})") +
               f"; its synchronised phases wait for input {waiting:.0%} of the time")
        if input_or_transfer(wait, moved) == "transfer":
            return "transfer", f"{said}: {why}; copying takes longer than waiting ({moved:.1f} vs {wait:.1f} ms)"
        return "input", f"{said}: {why}"
    if outside >= INPUT_BOUND_SHARE:
        said += (f" (the real step ran {outside:.0%} slower than the model alone, but its synchronised phases wait "
                 f"for input only {waiting:.0%} of the time: other work on the machine, or loader workers sharing "
                 "its cores, slowed it)")
    scaling = _scaling(batch, floors)
    if not floors or "shares" not in floors:
        if batch and batch["low"] >= OVERHEAD_GAIN:
            return "overhead", f"{said}; the floors were not counted{scaling}"
        return "compute", f"{said}; the floors were not counted, so overhead is not ruled out{scaling}"
    shares = floors["shares"]
    if max(shares.values()) < FLOOR_EXPLAINS and batch and batch["low"] >= OVERHEAD_GAIN:
        told = ", ".join(f"{k} {v:.0%}" for k, v in sorted(shares.items(), key=lambda kv: -kv[1]))
        return "overhead", (f"{said}; no floor explains half of the model's step ({told}), and twice the batch gives "
                            f"{batch['low']:.2f}× the items/s or more: a fixed cost per step that the operator count "
                            "does not see (work inside fused operators, Python between them)" + scaling)
    bound, why = floor_bound(shares, of="the model's step")
    extra = "" if bound != "memory" else (  # intensity and ridge are read only for a memory verdict
        f"; arithmetic intensity {floors['intensity']:.1f} FLOP/byte, "
        f"{'below' if floors['intensity'] < floors['ridge'] else 'at or above'} the ridge point {floors['ridge']:.0f}")
    return bound, f"{said}; {why}{extra}{scaling}"


def _scaling(batch: dict | None, floors: dict | None) -> str:
    """Batch scaling as corroboration: what the fixed cost alone predicts at twice the batch, what was measured."""
    if not batch:
        return ""
    said = f"; twice the batch gave {batch['speedup']:.2f}× ({batch['low']:.2f}–{batch['high']:.2f}) the items/s"
    if floors and "shares" in floors:
        f = min(floors["shares"]["overhead"], 0.99)
        said += f", where the overhead floor alone predicts {2 / (2 - f):.2f}×"
    return said + " (corroboration only: on a CPU larger matrix products also run faster)"


# ---------------------------------------------------------------- levers, each paired with its baseline

def _doubled(batch):
    return [torch.cat([x, x]) if isinstance(x, torch.Tensor) else x for x in batch]


def _lever_batch(b: _Bench, share: float, memory_limit_mb) -> dict | str:
    doubled = [_doubled(x) for x in b.batches]
    bigger = max(doubled, key=lambda x: sum(t.numel() for t in x if isinstance(t, torch.Tensor)))
    work = copy.deepcopy((b.model, b.optimizer))
    why = _fits(lambda: train_step(*work, bigger, b.device, loss_fn=b.loss_fn, host_inputs=b.host_inputs)(), b.device,
                memory_limit_mb)
    work = None
    if why:
        return f"batch {_items(bigger)} does not fit: {why}"
    got = b.compare(b.model_side, lambda: b.model_side(batches=doubled), share)
    return got if isinstance(got, str) else {**got, "what": f"batch {_items(bigger)} instead of {_items(b.batch)}"}


def _lever_amp(b: _Bench, share: float) -> dict | str:
    dtype = resolve_amp(True, b.device)  # not None: _inapplicable said so first
    got = b.compare(b.model_side, lambda: b.model_side(amp=dtype), share)
    return got if isinstance(got, str) else {**got, "what": f"autocast to {str(dtype).removeprefix('torch.')}"}


def _lever_channels_last(b: _Bench, share: float) -> dict | str:
    got = b.compare(b.model_side, lambda: b.model_side(channels_last=True), share)
    return got if isinstance(got, str) else {**got, "what": "channels_last memory format"}


def _lever_compile(b: _Bench, share: float) -> dict | str:
    require_compiler()
    torch._dynamo.reset()
    side = b.model_side(compiled=True)
    t0 = time.perf_counter()
    side.run(1)  # the first call compiles forward and backward
    compile_s = time.perf_counter() - t0
    got = b.compare(b.model_side, lambda: side, share)
    if isinstance(got, str):
        return got
    gain = side.step_s * (got["speedup"] - 1)  # seconds saved per step
    steps = compile_s / gain if gain > 0 else None
    return {**got, "compile_seconds": compile_s, "break_even_steps": steps,
            "what": f"torch.compile ({compile_s:.0f} s to compile; "
                    + (f"pays back after {steps:,.0f} steps)" if steps else "not faster, so it never pays back)")}


def _lever_threads(b: _Bench, share: float) -> dict | str:
    """One torch thread fewer, on the real step: when other programs hold a core, the step's threads wait for the
    one that is not running (lessons 01 and 02 set threads deliberately)."""
    import os

    have = torch.get_num_threads()
    if b.device.type != "cpu":
        return f"the model runs on `{b.device}`: the host's threads are not its pace"
    if have <= 1:
        return "torch uses 1 thread already"
    got = b.compare(b.real_side, lambda: b.real_side(threads=have - 1), share)
    load = f"load average {os.getloadavg()[0]:.1f} on {usable_cpus()} CPUs" if hasattr(os, "getloadavg") else ""
    return got if isinstance(got, str) else {**got, "threads": have - 1,
                                              "what": f"torch.set_num_threads({have - 1}) (was {have}; {load})"}


def _clearly_faster(threads) -> bool:
    """Whether the rest of a diagnosis is measured with one thread fewer: faster at the 10th percentile of the
    paired ratios, or 1.5× in the median (a busy machine's wide interval), not a coin toss."""
    return isinstance(threads, dict) and (threads["low"] > 1 or threads["speedup"] >= 1.5)


def _lever_workers(b: _Bench, share: float) -> dict | str:
    have, want = b.loader.num_workers, loader_workers()
    more = _like(b.loader, num_workers=want, persistent_workers=True)
    got = b.compare(b.real_side, lambda: b.real_side(more), share)
    return got if isinstance(got, str) else {**got, "what": f"num_workers={want}, persistent_workers=True "
                                                              f"(was {have})"}


def _lever_pinned(b: _Bench, share: float) -> dict | str:
    pinned = _like(b.loader, pin_memory=True)
    got = b.compare(b.real_side, lambda: b.real_side(pinned), share)
    return got if isinstance(got, str) else {**got, "what": "pin_memory=True with non_blocking copies"}


class _DecodedOnce(torch.utils.data.Dataset):
    """The learner's image dataset with every file decoded once and kept; its per-sample transforms still run."""

    def __init__(self, images: list, targets: list, transform=None, target_transform=None):
        self.images, self.targets, self.transform, self.target_transform = images, targets, transform, target_transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i):
        x, y = self.images[i], self.targets[i]
        return (self.transform(x) if self.transform else x), (self.target_transform(y) if self.target_transform else y)


def _decoder(dataset):
    """(decode(i), target(i), transform, target_transform) for the datasets whose decode step can be told apart
    from their transforms: torchvision's ``DatasetFolder``/``ImageFolder`` and the course's ``FileImageDataset``."""
    from torchvision.datasets import DatasetFolder

    if isinstance(dataset, DatasetFolder):
        return (lambda i: dataset.loader(dataset.samples[i][0]), lambda i: dataset.samples[i][1],
                dataset.transform, dataset.target_transform)
    if isinstance(dataset, FileImageDataset):
        from torchvision.io import decode_image
        return lambda i: decode_image(str(dataset.files[i])), lambda i: dataset.labels[i], dataset.transform, None
    return None


def _lever_decoded(b: _Bench, share: float) -> dict | str:
    decode, target, transform, target_transform = _decoder(b.loader.dataset)
    n, t0 = len(b.loader.dataset), time.perf_counter()
    images = [decode(i) for i in range(min(4, n))]
    need = (time.perf_counter() - t0) / len(images) * n
    if need > 0.5 * share:
        return f"{BUDGET}: decoding all {n:,} files once would take about {need:.1f} s of its {share:.1f} s"
    images += [decode(i) for i in range(len(images), n)]
    cached = _like(b.loader, dataset=_DecodedOnce(images, [target(i) for i in range(n)], transform, target_transform))
    got = b.compare(b.real_side, lambda: b.real_side(cached), share - need)
    mb = sum(x.nbytes if isinstance(x, torch.Tensor) else len(x.tobytes()) for x in images) / 2**20
    return got if isinstance(got, str) else {**got, "what": f"decode the {n:,} files once and keep them ({mb:,.0f} "
                                                              "MB); the per-sample transforms still run"}


def step_gains(name: str, got: dict, rates: dict) -> dict:
    """A lever's speed-up of the whole step, its interval, and the cap the other side sets (notebook 10).

    Per item: ``T`` the real step, ``M`` the model alone, ``I`` the input alone, ``G = T - M`` the real step's time
    outside the model. An input-side lever (measured on the real step) cannot beat the model alone: capped at
    ``T / M``. A model-side lever measured at ``s`` on the model alone leaves ``G`` as it was, and cannot beat the
    input alone: ``T / max(I, G + M / s)``, at most ``T / max(I, G)``.
    """
    if SIDE[name] == "step":  # measured on the real step, before the other measurements: no cap from them
        return {"step_speedup": got["speedup"], "step_low": got["low"], "step_high": got["high"], "cap": None,
                "capped": False, "measured_on": "real step"}
    t, m, i = 1 / rates["real"], 1 / rates["model"], 1 / rates["input"]
    if SIDE[name] == "input":
        cap = max(t / m, 1.0)
        gain = lambda s: min(s, cap)
    else:
        g = max(t - m, 0.0)
        cap = max(t / max(i, g, 1e-12), 1.0)
        gain = lambda s: t / max(i, g + m / s)
    return {"step_speedup": gain(got["speedup"]), "step_low": gain(got["low"]), "step_high": gain(got["high"]),
            "cap": cap, "capped": got["speedup"] > cap, "measured_on": "real step" if SIDE[name] == "input"
            else "model alone"}


def recommend(levers: dict) -> list:
    """The levers whose step speed-up is above ``WORTH`` at the lower end of its interval, fastest first
    (notebook 10)."""
    ranked = [{"lever": k, "step_speedup": round(v["step_speedup"], 3), "step_low": round(v["step_low"], 3),
               "step_high": round(v["step_high"], 3), "measured_speedup": round(v["speedup"], 3),
               "lesson": LESSON[k], "what": v["what"], "caveat": CAVEAT.get(k, "none")}
              for k, v in levers.items() if v["step_low"] > WORTH]
    return sorted(ranked, key=lambda r: -r["step_speedup"])


def advice(bottleneck: str, levers: dict, not_measured: dict, rates: dict) -> list:
    """For an input- or transfer-bound step: what will help on this machine, measured where it could be
    (notebook 10)."""
    if bottleneck not in ("input", "transfer"):
        return []
    cap = rates["real"] and rates["model"] / rates["real"]
    said = []
    for name, label in (("workers", "More loader workers"), ("decoded", "Decoding each file once"),
                        ("pinned", "Pinned memory")):
        got = levers.get(name)
        if got:
            verdict = "worth it" if got["step_low"] > WORTH else "not beyond the noise here"
            said.append(f"{label}: measured {got['step_speedup']:.2f}× the step ({got['step_low']:.2f}–"
                        f"{got['step_high']:.2f}), {verdict}" + (f" on {usable_cpus()} CPUs: workers compete with "
                                                                  "the training threads for the cores"
                                                                  if name == "workers" and verdict != "worth it"
                                                                  else "") + ".")
        elif name in not_measured and name != "pinned":
            said.append(f"{label}: {not_measured[name]}.")
    said.append("Lighter per-sample work (fewer or cheaper transforms on each image), or augmentation in batches on "
                "the device: lesson 03's `DeviceLoader` keeps the decoded images on the device as uint8 and crops and "
                "flips whole batches in a few kernels. Whatever is done to the input, the step cannot beat the model "
                f"alone: at most {cap:.2f}× ({rates['model']:,.0f} items/s).")
    return said


def default_levers(device: torch.device) -> tuple:
    """Every lever on CUDA; on CPUs and Macs all but ``compile`` (compiling takes tens of seconds there)
    (notebook 10)."""
    base = ("threads", "batch", "channels_last", "amp", "workers", "decoded", "pinned")
    return base + ("compile",) if device.type == "cuda" else base


COMPILE_MIN_S = 20  # compiling takes seconds even on a GPU: not started with less of the budget left
ALL_LEVERS = ("threads", "batch", "channels_last", "amp", "compile", "workers", "decoded", "pinned")


def _inapplicable(b: _Bench, name: str) -> str | None:
    """Why lever ``name`` cannot apply to this step at all (said before any budget is spent on it), or None."""
    from torch.utils.data import DataLoader, IterableDataset

    loader, data = b.loader, getattr(b.loader, "dataset", None)
    if name == "amp" and resolve_amp(True, b.device) is None:
        return "this CPU has no bf16 instructions: bf16 would be emulated, slower than fp32 (lesson 06)"
    if name == "channels_last" and not any(isinstance(m, nn.Conv2d) for m in b.model.modules()):
        return "no 2-D convolutions in this model"
    if name in ("workers", "pinned", "decoded") and not isinstance(loader, DataLoader):
        return "the loader is not a DataLoader (batches made in the training process or on the device)"
    if name == "workers" and isinstance(data, IterableDataset):
        return "an IterableDataset: its workers would each need their own share of the stream"
    if name == "workers" and loader_workers() <= loader.num_workers:
        return (f"it already uses {loader.num_workers} workers; this process may use {usable_cpus()} CPUs "
                "(lesson 04: cores − 1)")
    if name == "pinned" and b.device.type != "cuda":
        return f"no host→device copy to speed up on `{b.device}`"
    if name == "pinned" and not all(x.device.type == "cpu" for x in b.host_batch if isinstance(x, torch.Tensor)):
        return "the loader's batches are already on the device: nothing is copied"
    if name == "pinned" and loader.pin_memory:
        return "the loader already pins memory"
    if name == "decoded" and _decoder(data) is None:
        return ("diagnose can cache the decoding of torchvision's ImageFolder/DatasetFolder and the course's "
                "FileImageDataset only: for this dataset, decode once yourself (keep uint8 tensors) and measure")
    return None


def _lever(b: _Bench, name: str, share: float, memory_limit_mb) -> dict | str:
    runs = {"threads": lambda: _lever_threads(b, share), "batch": lambda: _lever_batch(b, share, memory_limit_mb),
            "amp": lambda: _lever_amp(b, share),
            "channels_last": lambda: _lever_channels_last(b, share), "compile": lambda: _lever_compile(b, share),
            "workers": lambda: _lever_workers(b, share), "decoded": lambda: _lever_decoded(b, share),
            "pinned": lambda: _lever_pinned(b, share)}
    why = _inapplicable(b, name)
    if why:
        return why
    if b.left() <= (COMPILE_MIN_S if name == "compile" else 0):
        return f"{BUDGET}: budget_s spent before this lever ({max(b.left(), 0):.0f} s left)"
    try:
        got = runs[name]()
    except Exception as exc:  # a lever that fails on this model is reported, the diagnosis goes on
        got = f"failed on this model: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    free_memory(b.device)
    return got if isinstance(got, str) else {**got, **step_gains(name, got, b.rates)}


def _measure_levers(b: _Bench, names, memory_limit_mb, judge) -> tuple[dict, dict, tuple]:
    """The batch lever first (the verdict uses it), then the verdict, then the other levers, those on the side the
    verdict points to first, each given an equal share of the time left."""
    skipped = {n: ("torch.compile on a CPU compiles for tens of seconds (lesson 08): add it with `--levers compile` "
                   "(`levers=[..., 'compile']`)" if n == "compile" else "not asked for") for n in ALL_LEVERS
               if n not in names and n != "threads"}
    measured = {}
    todo = [n for n in ALL_LEVERS if n in names]
    if "batch" in todo:
        todo.remove("batch")
        got = _lever(b, "batch", b.left() / (len(todo) + 1), memory_limit_mb)
        (skipped if isinstance(got, str) else measured)["batch"] = got
    verdict = judge(measured.get("batch"))
    todo.sort(key=lambda n: (SIDE[n] == "model") == (verdict[0] in ("input", "transfer")))
    for i, name in enumerate(todo):
        got = _lever(b, name, b.left() / (len(todo) - i), memory_limit_mb)
        (skipped if isinstance(got, str) else measured)[name] = got
    return measured, skipped, verdict


_STAGE: list = []  # what diagnose was doing last: the command line names it when something fails


def diagnose(model: nn.Module, loader, loss_fn=None, optimizer=None, device="auto", budget_s: float = 60, *,
             host_inputs=(), levers=None, memory_limit_mb: float | None = None) -> Diagnosis:
    """Measure what holds back one training step of ``model`` fed by ``loader``, and what each lever buys (notebook 10).

    Works on copies (``model`` and ``optimizer`` are not changed; RNG states are restored). ``budget_s`` bounds the
    measurements (the first step, the count and a compile may add to it); ``levers`` names those to measure
    (default ``default_levers``); ``memory_limit_mb`` plants a memory limit (on CUDA a real one is met as
    OutOfMemoryError).
    """
    t0, device = time.perf_counter(), pick_device(device)
    loss_fn = loss_fn or nn.CrossEntropyLoss()
    optimizer = optimizer or torch.optim.SGD(model.parameters(), lr=0.01)
    if hasattr(loader, "__next__"):  # a generator or iterator: one pass only
        raise ValueError("diagnose needs a loader it can iterate several times (a DataLoader or a list of batches), "
                         "not a one-shot iterator or generator")
    _STAGE.clear()
    stage = _STAGE.append
    with _untouched(model, optimizer) as (work, opt):
        work.to(device).train()
        stage("reading the loader's first batches")
        batches = _first_batches(loader)
        batch = batches[0]
        b = _Bench(work, opt, loader, batches, device, loss_fn, host_inputs, t0 + budget_s,
                   chunk_s=min(0.3, max(0.03, budget_s / 150)))
        first = copy.deepcopy((work, opt))  # copied outside the measured step: the copy is not the step's memory
        t1 = time.perf_counter()
        stage("the first training step")
        too_big = _fits(lambda: train_step(*first, batch, device, loss_fn=loss_fn, host_inputs=host_inputs)(), device,
                        memory_limit_mb)
        first_s, first = time.perf_counter() - t1, None
        free_memory(device)
        if too_big:
            return Diagnosis(str(device), _items(batch), "out of memory", f"batch {_items(batch)} does not fit: "
                             f"{too_big}", {}, not_measured={"everything": "the step itself does not fit"},
                             seconds=time.perf_counter() - t0)
        names = default_levers(device) if levers is None else tuple(levers)
        threads = _lever(b, "threads", 0.1 * budget_s, memory_limit_mb) if "threads" in names else "not asked for"
        with _threads(threads["threads"] if _clearly_faster(threads) else None):
            stage("timing the phases, the real step, the model alone and the input alone")
            phase_ms, b.rates, spread, overlap = _core(b, budget_s, first_s)
            stage("counting the step's operators, FLOPs and bytes (the floors)")
            floors = _floors(b, b.rates)
            stage("measuring the levers")
            measured, skipped, (bottleneck, reason) = _measure_levers(
                b, [n for n in names if n != "threads"], memory_limit_mb,
                lambda got: classify(b.rates, phase_ms, floors, got))
        (skipped if isinstance(threads, str) else measured)["threads"] = threads
    return Diagnosis(str(device), _items(batch), bottleneck, reason, {k: round(v, 3) for k, v in phase_ms.items()},
                     b.rates["input"], b.rates["model"], b.rates["real"], overlap, spread, floors, measured, skipped,
                     recommend(measured), advice(bottleneck, measured, skipped, b.rates), time.perf_counter() - t0)


def load_script(script: str) -> tuple:
    """model, loader, loss_fn, optimizer, host_inputs from a script's ``make_model``, ``make_loader`` and
    ``make_optimizer`` (``python -m helpers.diagnose SCRIPT``, notebook 10); ValueError with one line if it lacks
    them or they raise."""
    try:
        spec = runpy.run_path(script)
    except FileNotFoundError:
        raise ValueError(f"{script}: no such file") from None
    except Exception as exc:
        raise ValueError(f"{script} raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") \
            from None
    missing = [f for f in ("make_model", "make_loader", "make_optimizer") if f not in spec]
    if missing:
        raise ValueError(f"{script} must define {', '.join(missing)}")
    try:
        model = spec["make_model"]()
        loader = spec["make_loader"]()
        if hasattr(loader, "__next__"):  # a generator or iterator: made anew for each of diagnose's passes
            loader = Remade(spec["make_loader"])
        return model, loader, spec.get("loss_fn"), spec["make_optimizer"](model), spec.get("host_inputs", ())
    except Exception as exc:
        raise ValueError(f"{script}'s functions raised {type(exc).__name__}: "
                         f"{(str(exc).splitlines() or [''])[0]}") from None


def main(argv=None) -> int:
    """The command line: diagnose the step a script's make_model/make_loader/make_optimizer define (notebook 10)."""
    ap = argparse.ArgumentParser(prog="python -m helpers.diagnose", description=__doc__.split("\n\n")[0])
    ap.add_argument("script", help="a .py file defining make_model(), make_loader(), make_optimizer(model)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--budget-s", type=float, default=60)
    ap.add_argument("--levers", default="", help=f"levers to add to the default set, comma-separated (e.g. compile; "
                                                 f"all: {', '.join(ALL_LEVERS)})")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    ap.add_argument("--debug", action="store_true", help="show the traceback of a failure inside diagnose")
    args = ap.parse_args(argv)
    loader = None
    try:
        model, loader, loss_fn, optimizer, host_inputs = load_script(args.script)
        device = pick_device(args.device)
        extra = [n.strip() for n in args.levers.split(",") if n.strip()]
        unknown = [n for n in extra if n not in ALL_LEVERS]
        if unknown:
            raise ValueError(f"unknown lever {', '.join(unknown)}: choose from {', '.join(ALL_LEVERS)}")
        result = diagnose(model, loader, loss_fn, optimizer, device, args.budget_s, host_inputs=host_inputs,
                          levers=tuple(dict.fromkeys([*default_levers(device), *extra])))
    except ValueError as exc:
        print(f"error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    except Exception as exc:  # inside diagnose: one line naming the stage and the loader, the traceback on demand
        if args.debug:
            raise
        print(f"error: diagnose failed while {(_STAGE or ['starting'])[-1]}, with {loader_setting(loader)}: "
              f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]} (--debug shows the traceback)",
              file=sys.stderr)
        return 1
    print(json.dumps(result.to_dict(), indent=1) if args.json else result.markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
