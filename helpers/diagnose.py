"""Diagnose a training step: what holds it back, and which of the course's levers helps, measured (notebook 10).

    diagnose(model, loader, loss_fn, optimizer, device="auto", budget_s=60) -> Diagnosis
    python -m helpers.diagnose my_training.py [--device D] [--budget-s S] [--json]

It measures, on copies of the learner's model and optimizer (the originals, and the global random generators of
torch, CUDA, Python and NumPy, are left as they were; a loader's own generator moves on as in any epoch): the
step's phases, the input pipeline alone and the model alone, then the same step with each lever the course teaches
that applies on this device, as a ratio of items per second. Levers it cannot measure are listed
with the reason. The file given to the command line defines ``make_model()``, ``make_loader()``,
``make_optimizer(model)`` and optionally ``loss_fn`` and ``host_inputs`` (input positions kept on the CPU).
"""
from __future__ import annotations

import argparse
import copy
import json
import runpy
import statistics
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from .devices import pick_device, synchronize, usable_cpus
from .profiling import INPUT_BOUND_SHARE, annotated_step, forever, free_memory, profiler_peak_mb
from .timing import time_train_step
from .training import _rng_state, _set_rng_state, make_scaler, optimizer_step, resolve_amp, split_batch

LESSON = {"workers": "04", "pinned": "03", "amp": "06", "channels_last": "06", "batch": "05 and 09",
          "compile": "08"}
CAVEAT = {"amp": "lower precision: check the accuracy (lesson 06)",
          "batch": "a larger batch changes training: scale the learning rate (linear rule, lesson 05) and check "
                   "the accuracy",
          "compile": "pays back only after the break-even number of steps"}
BOTTLENECK_LESSON = {"input": "04", "transfer": "03", "overhead": "08", "compute": "06 and 08", "memory": "09"}
INPUT_SHARE = INPUT_BOUND_SHARE  # data wait + host→device copy this share of the step: input-/transfer-bound (09)
OVERHEAD_GAIN = 4 / 3  # twice the batch gives this many times the items/s or more: a fixed cost is half the step
WORTH = 1.05           # a lever is recommended from this measured speed-up on


@dataclass
class Diagnosis:
    """What ``diagnose`` measured, as plain data (``to_dict`` for JSON) and as a report (``markdown``)."""

    device: str
    batch_size: int
    bottleneck: str
    reason: str
    phase_ms: dict
    idle_share: float
    input_items_per_s: float
    model_items_per_s: float
    levers: dict = field(default_factory=dict)            # lever -> {"speedup": float, ...}
    not_measured: dict = field(default_factory=dict)      # lever -> why not
    recommendations: list = field(default_factory=list)   # ranked: {"lever", "measured_speedup", "lesson", ...}
    seconds: float = 0.0
    doubling_gain: float | None = None  # items/s at twice the batch over now, from the fitted step times

    def to_dict(self) -> dict:
        return asdict(self)

    def markdown(self) -> str:
        """The report: bottleneck, phases, input vs model, what to change first."""
        head = f"**Bottleneck: {self.bottleneck}** — {self.reason} (lesson {BOTTLENECK_LESSON[self.bottleneck]})."
        if self.bottleneck == "memory":
            return (f"{head}\n\nNothing else was measured. Lesson 09's levers: a smaller batch, activation "
                    "checkpointing, mixed precision, sharding the model (FSDP2).\n\n"
                    f"(diagnosis took {self.seconds:.0f} s)")
        lines = [head, "", f"Device `{self.device}`, batch {self.batch_size}; step phases (ms): " +
                 ", ".join(f"{k} {v:.1f}" for k, v in self.phase_ms.items()) +
                 f"; the device waits {self.idle_share:.0%} of the step.",
                 f"Input pipeline alone: {self.input_items_per_s:,.0f} items/s; model alone: "
                 f"{self.model_items_per_s:,.0f} items/s.", "",
                 "| change first | speed-up of the step | as measured | lesson | caveat |", "|---|---|---|---|---|"]
        lines += [f"| {r['lever']}: {r['what']} | {r['step_speedup']:.2f}× | {r['measured_speedup']:.2f}× "
                  f"{'(whole step)' if r['lever'] in END_TO_END else '(model alone)'} | {r['lesson']} | {r['caveat']} |"
                  for r in self.recommendations] or ["| nothing measured speeds the step up by 5 % or more | | | | |"]
        chosen = {r["lever"] for r in self.recommendations}
        lines += [f"- measured, no gain for this step: {k} ({v['what']}): {v['speedup']:.2f}× "
                  + ("for the whole step" if k in END_TO_END else "for the model alone"
                     + (", but the step waits for data" if v["speedup"] >= WORTH else ""))
                  for k, v in self.levers.items() if k not in chosen]
        lines += [f"- not measured: {k} — {why}" for k, why in self.not_measured.items()]
        return "\n".join(lines) + f"\n\n(diagnosis took {self.seconds:.0f} s)"


@contextmanager
def _untouched(model: nn.Module, optimizer):
    """Copies of model and optimizer to measure with (the optimizer keeps pointing at the copy's parameters);
    the RNG states are restored afterwards, so the learner's run continues as if nothing happened."""
    rng = _rng_state()
    work_model, work_opt = copy.deepcopy((model, optimizer))
    # An LR scheduler patches optimizer.step with a closure over the *original* optimizer; Optimizer.__getstate__
    # leaves that patch out of the copy, so the copy steps its own parameters (a test holds torch to it).
    try:
        yield work_model, work_opt
    finally:
        _set_rng_state(rng)


def _items(batch) -> int:
    return int(batch[-1].shape[0])


def _check_batch(batch) -> None:
    if not isinstance(batch, (tuple, list)) or len(batch) < 2 or not isinstance(batch[-1], torch.Tensor):
        raise ValueError(f"each batch must be (*inputs, target) with a tensor target, as fit() takes; this loader "
                         f"yields a {type(batch).__name__}: wrap it (e.g. a generator yielding (x, y)) first")


def _on_device(batch, device, host_inputs) -> list:
    inputs, target = split_batch(batch, device, host_inputs)
    return [*inputs, target]


def _step(model, optimizer, batch, device, loss_fn, host_inputs) -> None:
    """One plain training step (``training.optimizer_step``), to see whether a batch fits."""
    inputs, target = split_batch(batch, device, host_inputs)
    optimizer_step(model, optimizer, inputs, target, loss_fn=loss_fn, scaler=make_scaler(device, None), device=device)


def _phases(model, optimizer, loader, device, loss_fn, host_inputs, steps: int) -> tuple[dict, float]:
    """Median ms per phase over ``steps`` real steps fed by ``loader`` (after one warm-up), and items/s over them."""
    sizes = []
    batches = (sizes.append(_items(batch)) or batch for batch in forever(loader))  # notes each size drawn
    rows = [annotated_step(model, optimizer, batches, device, loss_fn, host_inputs) for _ in range(steps + 1)][1:]
    phase_ms = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    return phase_ms, sum(sizes[1:]) / (sum(sum(r.values()) for r in rows) / 1e3)


def input_items_per_s(loader, device, seconds: float = 2.0) -> float:
    """Items/s the input pipeline alone delivers, batches moved to ``device`` (start-up excluded) (notebook 10)."""
    batches = forever(loader)
    next(batches)
    seen, t0 = 0, time.perf_counter()
    while seen == 0 or time.perf_counter() - t0 < seconds:
        batch = next(batches)
        for x in batch:
            if isinstance(x, torch.Tensor):
                x.to(device, non_blocking=device.type == "cuda")
        seen += _items(batch)
    synchronize(device)
    return seen / (time.perf_counter() - t0)


def _doubled(batch):
    return [torch.cat([x, x]) if isinstance(x, torch.Tensor) else x for x in batch]


def _fits(run, device, memory_limit_mb: float | None) -> str | None:
    """None if ``run()`` fits (on CUDA: no OutOfMemoryError; elsewhere: the CPU peak under ``memory_limit_mb``),
    else the reason. The CPU check measures the peak with the profiler, so a planted limit is met for real."""
    try:
        if memory_limit_mb is not None and device.type != "cuda":
            peak = profiler_peak_mb(run)
            if peak > memory_limit_mb:
                return f"needs {peak:.0f} MB, over the {memory_limit_mb:.0f} MB limit"
        else:
            run()
    except torch.OutOfMemoryError as exc:
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return f"out of memory ({str(exc).splitlines()[0][:100]})"
    return None


class _Bench:
    """The shared context of one diagnosis: the work copies, the fixed batch, the device, the time left."""

    def __init__(self, model, optimizer, batch, device, loss_fn, host_inputs, deadline):
        self.model, self.optimizer, self.host_batch, self.device = model, optimizer, batch, device
        self.batch = _on_device(batch, device, host_inputs)  # the model alone: no copy per step
        self.loss_fn, self.host_inputs, self.deadline = loss_fn, host_inputs, deadline

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def rate(self, batch=None, seconds: float = 1.0, **kw) -> float:
        """Items/s of the model alone on a fixed batch (``timing.time_train_step``, on fresh copies); ``kw``: amp,
        channels_last."""
        model, opt = copy.deepcopy((self.model, self.optimizer))
        return time_train_step(model, self.batch if batch is None else batch, self.device, optimizer=opt,
                               loss_fn=self.loss_fn, host_inputs=self.host_inputs, warmup=1, min_run_time=seconds,
                               **kw).items_per_s


def _lever_amp(b: _Bench, base: float) -> dict | str:
    dtype = resolve_amp(True, b.device)
    if dtype is None:
        return "this CPU has no bf16 instructions: bf16 would be emulated, slower than fp32 (lesson 06)"
    return {"speedup": b.rate(amp=dtype) / base, "what": f"autocast to {str(dtype).removeprefix('torch.')}"}


def _lever_channels_last(b: _Bench, base: float) -> dict | str:
    if not any(isinstance(m, nn.Conv2d) for m in b.model.modules()):
        return "no 2-D convolutions in this model"
    return {"speedup": b.rate(channels_last=True) / base, "what": "channels_last memory format"}


def _lever_pinned(b: _Bench, base: float) -> dict | str:
    if b.device.type != "cuda":
        return f"no host→device copy to speed up on `{b.device}`"
    if not all(x.device.type == "cpu" for x in b.host_batch if isinstance(x, torch.Tensor)):
        return "the loader's batches are already on the device: nothing is copied"
    def run(pinned):
        model, opt = copy.deepcopy((b.model, b.optimizer))
        return time_train_step(model, b.host_batch, b.device, optimizer=opt, loss_fn=b.loss_fn, host_inputs=b.host_inputs,
                               batch_on_host=True, pinned=pinned, min_run_time=0.5).items_per_s
    return {"speedup": run(True) / run(False), "what": "pin_memory=True with non_blocking copies"}


def _lever_workers(b: _Bench, loader, step_rate: float) -> dict | str:
    from torch.utils.data import DataLoader, IterableDataset

    from .devices import loader_workers

    if not isinstance(loader, DataLoader):
        return "the loader is not a DataLoader (batches made in the training process or on the device)"
    if isinstance(loader.dataset, IterableDataset):
        return "an IterableDataset: its workers would each need their own share of the stream"
    have, want = loader.num_workers, loader_workers()
    if want <= have:
        return f"it already uses {have} workers; this process may use {usable_cpus()} CPUs (lesson 04: cores − 1)"
    batching = dict(batch_sampler=loader.batch_sampler) if loader.batch_size is None else \
        dict(batch_size=loader.batch_size, sampler=loader.sampler, drop_last=loader.drop_last)
    more = DataLoader(loader.dataset, collate_fn=loader.collate_fn, num_workers=want, persistent_workers=True,
                      pin_memory=loader.pin_memory, worker_init_fn=loader.worker_init_fn,
                      generator=loader.generator, **batching)
    model, opt = copy.deepcopy((b.model, b.optimizer))
    _, rate = _phases(model, opt, more, b.device, b.loss_fn, b.host_inputs, steps=6)
    return {"speedup": rate / step_rate, "what": f"num_workers={want}, persistent_workers=True (was {have})"}


def _lever_batch(b: _Bench, base: float, memory_limit_mb, doublings: int = 1, start=None) -> dict | str:
    """Double the batch (from ``start``, else the loader's) while it fits — the step is run once first, so out of
    memory is caught, never a crash — and while doubling still pays (5 % more items/s), ``doublings`` times at
    most. ``speedup`` is the best batch's items/s over the loader's batch, ``double_speedup`` the first doubling's
    gain, ``points`` the step seconds by batch size (``doubling_gain`` fits them for ``classify``). ``diagnose``
    doubles once first and more at the end if the budget allows."""
    batch = b.batch if start is None else start
    best, best_rate, tried, first, last = None, base, [], None, base if start is None else b.rate(start)
    points = {_items(batch): _items(batch) / last}  # batch size -> seconds per step
    for _ in range(doublings):
        bigger = _doubled(batch)
        model, opt = copy.deepcopy((b.model, b.optimizer))
        why = _fits(lambda: _step(model, opt, bigger, b.device, b.loss_fn, b.host_inputs), b.device, memory_limit_mb)
        if why:
            tried.append(f"{_items(bigger)} does not fit: {why}")
            break
        rate = b.rate(bigger)
        points[_items(bigger)] = _items(bigger) / rate
        first = first or rate / base
        tried.append(f"{_items(bigger)}: {rate / base:.2f}×")
        best, best_rate = (bigger, rate) if rate > best_rate else (best, best_rate)
        if rate < WORTH * last or b.left() <= 0:
            break
        batch, last = bigger, rate
    if first is None:
        return f"batch {tried[0]}"
    return {"speedup": best_rate / base, "double_speedup": first, "best": best, "tried": tried, "points": points}


def _batch_result(got: dict, b: _Bench) -> dict:
    """The batch lever as reported: the best batch in words, no tensors."""
    best, tried = got.pop("best"), got.pop("tried")
    got["what"] = (f"batch {_items(best)} instead of {_items(b.batch)}" if best is not None else
                   f"no larger batch than {_items(b.batch)} was faster") + f" (tried {'; '.join(tried)})"
    return got


def _more_batch(b: _Bench, base: float, got: dict, memory_limit_mb) -> dict:
    """With budget left after the other levers, keep doubling from the best batch so far (twice more at most)."""
    if b.left() <= 0 or got["best"] is None or got["speedup"] < WORTH:
        return got
    more = _lever_batch(b, base, memory_limit_mb, doublings=2, start=got["best"])
    if isinstance(more, str):
        got["tried"].append(more.removeprefix("batch "))
    else:
        if more["speedup"] > got["speedup"]:
            got.update(speedup=more["speedup"], best=more["best"])
        got["tried"] += more["tried"]
        got["points"].update(more["points"])
    return got


def doubling_gain(points: dict, batch: int) -> float:
    """Items/s at twice ``batch`` over items/s at ``batch``, from a line ``seconds = a + b × size`` fitted through the
    measured step times (``{size: seconds}``): one ratio is noisy, a line through all the sizes tried is steadier.
    With the fixed part's share ``f = a / t(batch)`` it is ``2 / (2 - f)`` (notebook 10)."""
    from .profiling import linear_fit

    fixed, per_item = linear_fit(points)
    share = min(max(fixed / (fixed + per_item * batch), 0.0), 0.99)
    return 2 / (2 - share)


def _lever_compile(b: _Bench, base: float) -> dict | str:
    from .regimes import compare_compiled

    out = compare_compiled(lambda: copy.deepcopy(b.model), b.batch, b.device, host_inputs=b.host_inputs)
    if "error" in out:
        return f"torch.compile failed here: {out['error']}"
    steps = out["break_even_steps"]
    return {"speedup": out["speedup"], "compile_seconds": out["compile_seconds"], "break_even_steps": steps,
            "what": f"torch.compile (timed with SGD and cross-entropy; {out['compile_seconds']:.0f} s to compile; "
                    + (f"pays back after {steps:.0f} steps)" if steps else "not faster, so it never pays back)")}


def classify(phase_ms: dict, input_rate: float, model_rate: float, batch_gain: float | None) -> tuple[str, str]:
    """The bottleneck (``input``, ``transfer``, ``overhead``, ``compute``) and the measured reason (notebook 10).

    Input: the pipeline alone is slower than the model alone, or waiting for data and the host→device copy
    together take ``INPUT_SHARE`` of the step (lesson 09's rule), mostly waiting. Transfer: the same, mostly
    copying. Overhead: twice the batch gives ``OVERHEAD_GAIN`` times the items/s (``doubling_gain``: the per-step
    fixed cost is half the step or more). Otherwise compute. (``memory``, the step not fitting,
    is decided before any of this.)
    """
    step = sum(phase_ms.values())
    wait, copy_ = phase_ms.get("data wait", 0) / step, phase_ms.get("host to device", 0) / step
    rates = f"the input pipeline alone delivers {input_rate:,.0f} items/s, the model alone takes {model_rate:,.0f}"
    if input_rate < model_rate:
        return "input", f"{rates}: the input is the slower side; the step waits for data {wait:.0%} of its time"
    if wait + copy_ >= INPUT_SHARE:  # lesson 09's rule: data wait and copy together
        if copy_ > wait:
            return "transfer", f"the host→device copy takes {copy_:.0%} of the step (data wait {wait:.0%})"
        return "input", (f"the step waits for data {wait:.0%} of its time: loading is not overlapped with compute "
                         f"({rates})")
    if batch_gain is not None and batch_gain >= OVERHEAD_GAIN:
        fixed = 2 - 2 / batch_gain  # t(B) = a + bB and t(2B) = a + 2bB give a / t(B) = 2 - 2 / gain
        return "overhead", (f"twice the batch gives about {batch_gain:.2f}× the items/s, so about {fixed:.0%} of the step "
                            "costs the same whatever the batch (operator launches, Python, small kernels, the "
                            "optimizer's update): lesson 09 would call it launch-bound on a GPU")
    gain = (f"; twice the batch gives only about {batch_gain:.2f}× the items/s" if batch_gain is not None else
            "; the batch lever was not measured within the budget, so overhead is not ruled out (a larger budget_s "
            "measures it)")
    return "compute", f"forward, backward and optimizer take {1 - wait - copy_:.0%} of the step{gain}"


END_TO_END = ("workers", "pinned")  # measured as whole steps; the others on the model alone


def recommend(levers: dict, phase_ms: dict, input_cap: float | None = None) -> list:
    """Levers ranked by the speed-up of the whole step. A model-side lever (measured on the model alone) speeds up
    forward, backward and optimizer only: the measured data wait and copy stay, so its step speed-up is
    ``step / (wait + copy + compute / speedup)``, and never above ``input_cap`` (the input pipeline's items/s over
    the step's: what the input alone could feed). Workers and pinned copies were measured as whole steps."""
    step = sum(phase_ms.values())
    fixed = phase_ms.get("data wait", 0.0) + phase_ms.get("host to device", 0.0)
    ranked = []
    for name, got in levers.items():
        if name in END_TO_END:
            step_gain = got["speedup"]
        else:
            step_gain = step / (fixed + (step - fixed) / got["speedup"])
            if input_cap is not None:
                step_gain = min(step_gain, input_cap)
        if step_gain >= WORTH:
            ranked.append({"lever": name, "measured_speedup": round(got["speedup"], 3),
                           "step_speedup": round(step_gain, 3), "lesson": LESSON[name], "what": got["what"],
                           "caveat": CAVEAT.get(name, "none")})
    return sorted(ranked, key=lambda r: -r["step_speedup"])


def default_levers(device: torch.device) -> tuple:
    """Every lever on CUDA; on CPUs and Macs all but ``compile`` (compiling takes tens of seconds there)."""
    base = ("channels_last", "amp", "pinned", "batch", "workers")
    return base + ("compile",) if device.type == "cuda" else base


COMPILE_MIN_S = 20  # compiling takes seconds even on a GPU: not started with less of the budget left


def _measure_levers(b: _Bench, loader, base: float, step_rate: float, names, memory_limit_mb) -> tuple[dict, dict]:
    runs = {"batch": lambda: _lever_batch(b, base, memory_limit_mb),
            "channels_last": lambda: _lever_channels_last(b, base), "amp": lambda: _lever_amp(b, base),
            "pinned": lambda: _lever_pinned(b, base),
            "workers": lambda: _lever_workers(b, loader, step_rate), "compile": lambda: _lever_compile(b, base)}
    measured, skipped = {}, {}
    for name in runs:  # batch first: classify needs it
        if name not in names:
            skipped[name] = ("torch.compile on a CPU compiles for tens of seconds (lesson 08): pass "
                             "levers=[..., 'compile'] to measure it") if name == "compile" else "not asked for"
            continue
        if b.left() <= (COMPILE_MIN_S if name == "compile" else 0):
            skipped[name] = f"budget_s spent before this lever ({max(b.left(), 0):.0f} s left)"
            continue
        try:
            got = runs[name]()
        except Exception as exc:  # a lever that fails on this model is reported, the diagnosis goes on
            got = f"failed on this model: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
        free_memory(b.device)
        (skipped if isinstance(got, str) else measured)[name] = got
    if "batch" in measured:
        measured["batch"] = _batch_result(_more_batch(b, base, measured["batch"], memory_limit_mb), b)
    return measured, skipped


def diagnose(model: nn.Module, loader, loss_fn=None, optimizer=None, device="auto", budget_s: float = 60, *,
             host_inputs=(), levers=None, memory_limit_mb: float | None = None) -> Diagnosis:
    """Measure what holds back one training step of ``model`` fed by ``loader``, and what each lever buys (notebook 10).

    Works on copies (``model`` and ``optimizer`` are not changed; RNG states are restored). ``budget_s`` bounds the
    levers' measurements; ``memory_limit_mb`` plants a memory limit (on CUDA a real one is met as OutOfMemoryError).
    """
    t0, device = time.perf_counter(), pick_device(device)
    loss_fn = loss_fn or nn.CrossEntropyLoss()
    optimizer = optimizer or torch.optim.SGD(model.parameters(), lr=0.01)
    if hasattr(loader, "__next__"):  # a generator or iterator: one pass only
        raise ValueError("diagnose needs a loader it can iterate several times (a DataLoader or a list of batches), "
                         "not a one-shot iterator or generator")
    with _untouched(model, optimizer) as (work, opt):
        work.to(device).train()
        batch = next(iter(loader))
        _check_batch(batch)
        b = _Bench(work, opt, batch, device, loss_fn, host_inputs, t0 + budget_s)
        first = copy.deepcopy((work, opt))  # copied outside the measured step: the copy is not the step's memory
        too_big = _fits(lambda: _step(*first, batch, device, loss_fn, host_inputs), device, memory_limit_mb)
        del first
        free_memory(device)
        if too_big:
            return Diagnosis(str(device), _items(batch), "memory", f"batch {_items(batch)} does not fit: {too_big}",
                             {}, 0.0, 0.0, 0.0, not_measured={"everything": "the step itself does not fit"},
                             seconds=time.perf_counter() - t0)
        phase_ms, step_rate = _phases(*copy.deepcopy((work, opt)), loader, device, loss_fn, host_inputs, steps=8)
        input_rate = input_items_per_s(loader, device, seconds=min(2.0, budget_s / 20))
        base = b.rate()
        measured, skipped = _measure_levers(b, loader, base, step_rate, levers or default_levers(device),
                                            memory_limit_mb)
    batch_lever = measured.get("batch")
    gain = doubling_gain(batch_lever["points"], _items(batch)) if batch_lever else None
    bottleneck, reason = classify(phase_ms, input_rate, base, gain)
    step = sum(phase_ms.values())
    idle = (phase_ms["data wait"] + phase_ms["host to device"]) / step
    return Diagnosis(str(device), _items(batch), bottleneck, reason, {k: round(v, 3) for k, v in phase_ms.items()},
                     idle, input_rate, base, measured, skipped, recommend(measured, phase_ms, input_rate / step_rate),
                     time.perf_counter() - t0, gain)


def main(argv=None) -> int:
    """The command line: diagnose the step that a script's make_model/make_loader/make_optimizer define (notebook 10)."""
    ap = argparse.ArgumentParser(prog="python -m helpers.diagnose", description=__doc__.split("\n\n")[0])
    ap.add_argument("script", help="a .py file defining make_model(), make_loader(), make_optimizer(model)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--budget-s", type=float, default=60)
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args(argv)
    try:
        spec = runpy.run_path(args.script)
        missing = [f for f in ("make_model", "make_loader", "make_optimizer") if f not in spec]
        if missing:
            raise ValueError(f"{args.script} must define {', '.join(missing)}")
        model = spec["make_model"]()
        result = diagnose(model, spec["make_loader"](), spec.get("loss_fn"), spec["make_optimizer"](model),
                          args.device, args.budget_s, host_inputs=spec.get("host_inputs", ()))
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result.to_dict(), indent=1) if args.json else result.markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
