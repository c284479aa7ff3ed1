"""One training loop for the whole course: device, AMP, scheduler, metrics, progress, checkpoint/resume (taught in
notebook 01; lessons 03-11 train with it).

Notebook 00 introduces it; notebook 01 uses it first. The loop is the plain PyTorch one
(forward, loss, ``zero_grad``, ``backward``, ``step``) with the bookkeeping every lesson needs.
Batches are tuples ``(*inputs, target)``; the model is called as ``model(*inputs)``.
"""
from __future__ import annotations

import pickle
import random
import re
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from .ceilings import main_dtype, measured_ceilings, mfu
from .counting import count_step
from .devices import pick_device
from .results import atomic_write, shown_path
from .step import make_scaler, optimizer_step, resolve_amp, split_batch

CHECKPOINT_FORMAT = "helpers.training/1"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used: truncated, corrupt, unsafe, or from another program (notebook 04)."""


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's random generators (all devices) in one call (notebook 01)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@dataclass
class History:
    """What ``fit`` measured, as plain lists of dicts (JSON- and checkpoint-friendly) (notebook 01)."""

    iterations: list = field(default_factory=list)   # {"iteration", "epoch", "loss", "lr"}
    validation: list = field(default_factory=list)   # {"iteration", "epoch", "loss", "accuracy"}
    epochs: list = field(default_factory=list)       # {"epoch", "train_loss", "train_accuracy", "seconds", ...}

    def state_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_state_dict(cls, d: dict) -> "History":
        return cls(**{k: list(d.get(k, [])) for k in ("iterations", "validation", "epochs")})

    @property
    def final(self) -> dict:
        """The last epoch's record (empty dict before the first epoch ends)."""
        return self.epochs[-1] if self.epochs else {}


# ---------------------------------------------------------------- batches and evaluation

def _unwrap(model: nn.Module) -> nn.Module:
    # A DDP wrapper's forward may start collectives (buffer broadcasts) that the other ranks would not join:
    # evaluation on one rank must call the plain module inside it.
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def _outputs(model: nn.Module, loader, device, host_inputs, amp):
    """``(output, target)`` of every batch in eval mode without gradients; the model's mode is restored after."""
    model, dtype = _unwrap(model), resolve_amp(amp, device)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for batch in loader:
                inputs, target = split_batch(batch, device, host_inputs)
                with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                    yield model(*inputs).float(), target
    finally:
        model.train(was_training)


def evaluate(model: nn.Module, loader, device="auto", *, loss_fn=None, amp=False, host_inputs=()) -> dict:
    """Mean loss and accuracy of ``model`` over ``loader`` without gradients (MATLAB ``testnet``; notebook 01)."""
    device, loss_fn = pick_device(device), loss_fn or nn.CrossEntropyLoss()
    loss_sum, correct, count = torch.zeros((), device=device), torch.zeros((), device=device, dtype=torch.long), 0
    for out, target in _outputs(model, loader, device, host_inputs, amp):
        loss_sum += loss_fn(out, target) * target.shape[0]
        correct += (out.argmax(1) == target).sum()
        count += target.shape[0]
    if count == 0:
        raise ValueError("evaluate() got an empty loader")
    return {"loss": loss_sum.item() / count, "accuracy": correct.item() / count, "count": count}


def predict(model: nn.Module, loader, device="auto", *, host_inputs=(), amp=False) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores and targets for every batch, gathered on the CPU (MATLAB ``minibatchpredict``; notebook 01)."""
    pairs = list(_outputs(model, loader, pick_device(device), host_inputs, amp))
    if not pairs:
        raise ValueError("predict() got an empty loader")
    return torch.cat([s for s, _ in pairs]).cpu(), torch.cat([t for _, t in pairs]).cpu()


def flip_accuracy(model: nn.Module, loader, device="auto", *, amp=False) -> dict:
    """Test-time augmentation with mirror images, from two passes over ``loader`` (notebook 05).

    ``accuracy``: the class of the summed logits of each image and its mirror image; ``plain``: the images alone.
    The batches are ``(images, target)`` with images ``(N, C, H, W)``; the mirror flips the last (width) axis.
    Both passes must see the same images in the same order: an unshuffled loader with a deterministic transform.
    """
    plain, target = predict(model, loader, device, amp=amp)
    mirrored, _ = predict(model, ((x.flip(3), y) for x, y in loader), device, amp=amp)
    return {"accuracy": ((plain + mirrored).argmax(1) == target).sum().item() / len(target),
            "plain": (plain.argmax(1) == target).sum().item() / len(target), "count": len(target)}


# ---------------------------------------------------------------- checkpoints

def rng_state() -> dict:
    """The state of every random generator (Python, NumPy, torch, CUDA), for a checkpoint (notebook 04)."""
    np_state = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore the generators saved by ``rng_state``. The states must be CPU tensors (``set_rng_state`` refuses
    others), and CUDA states are restored only for the GPUs this machine has (a run may resume elsewhere).
    (notebook 04)"""
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        for index, cuda_state in enumerate(state["cuda"][:torch.cuda.device_count()]):
            torch.cuda.set_rng_state(cuda_state, index)


def previous_path(path: str | Path) -> Path:
    """Where the checkpoint before the latest one is kept: ``run.pt`` -> ``run.prev.pt`` (notebook 04)."""
    path = Path(path)
    return path.with_name(f"{path.stem}.prev{path.suffix}")


def save_checkpoint(path: str | Path, state: dict) -> Path:
    """Write ``state`` atomically (temp file, fsync, rename), keeping the old one as ``*.prev`` (notebook 00)."""
    return atomic_write(path, lambda fh: torch.save(state, fh), keep_previous=previous_path(path))


def load_checkpoint(path: str | Path, map_location="cpu") -> dict:
    """Load a checkpoint with ``weights_only=True``; raise ``CheckpointError`` with the fix if unusable.
    (notebook 04)"""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"no checkpoint at {shown_path(path)}")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"GLOBAL ([\w.]+)", str(exc))
        what = (f"it asks to call or build {found.group(1)}" if found
                else "it holds objects other than tensors and plain data")
        raise CheckpointError(
            f"refused to load {shown_path(path)}: {what}. Loading it with weights_only=False would run code from "
            "the file; only do that for files you wrote yourself."
        ) from None
    except Exception as exc:  # truncated zip, bad magic number, short read ...
        prev = previous_path(path)
        hint = (f" The previous checkpoint {prev.name} is intact: rename it to {path.name} to resume from it."
                if prev.exists() else " Delete it to start over.")
        raise CheckpointError(f"checkpoint {shown_path(path)} is truncated or corrupt ({type(exc).__name__})."
                              f"{hint}") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{shown_path(path)} is not a checkpoint written by helpers.training")
    return state


# ---------------------------------------------------------------- the loop: fit = epochs of steps + bookkeeping

class EpochMeter:
    """Loss, accuracy, learning rates and training seconds of one epoch, cheap on the hot path (notebook 01).

    ``add`` keeps references to the step's tensors; ``flush`` turns them into numbers with one device->host
    copy (at validation, checkpoints and the epoch's end), so no step waits for the GPU just to log.
    """

    def __init__(self, epoch: int, iteration: int, totals: dict | None = None):
        self.epoch = epoch
        self.totals = dict(totals or {"loss_sum": 0.0, "correct": 0, "seen": 0, "seconds": 0.0})
        self._reset(iteration)

    def _reset(self, iteration: int) -> None:
        self.losses, self.corrects, self.sizes, self.lrs = [], [], [], []
        self.first_iteration = iteration
        self.restart_clock()

    def restart_clock(self) -> None:
        """Start timing training again (validation and checkpoint writing are not training time)."""
        self.t0 = time.perf_counter()

    def add(self, loss: torch.Tensor, out: torch.Tensor, target: torch.Tensor, lr: float) -> None:
        self.losses.append(loss.detach())
        self.corrects.append((out.detach().argmax(1) == target).sum())
        self.sizes.append(target.shape[0])
        self.lrs.append(lr)

    def flush(self, history: "History") -> None:
        """Append the pending per-step records to ``history`` and add them to the epoch's totals."""
        values = torch.stack(self.losses).tolist() if self.losses else []
        for i, (value, lr) in enumerate(zip(values, self.lrs)):
            history.iterations.append({"iteration": self.first_iteration + i + 1, "epoch": self.epoch,
                                       "loss": value, "lr": lr})
        t = self.totals
        t["loss_sum"] += sum(v * n for v, n in zip(values, self.sizes))
        t["correct"] += int(torch.stack(self.corrects).sum().item()) if self.corrects else 0
        t["seen"] += sum(self.sizes)
        t["seconds"] += time.perf_counter() - self.t0
        self._reset(self.first_iteration + len(values))

    def record(self, iteration: int, lr: float) -> dict:
        """The epoch's summary for ``History.epochs`` (call after the last ``flush``)."""
        seen = max(self.totals["seen"], 1)
        return {"epoch": self.epoch + 1, "iteration": iteration, "train_loss": self.totals["loss_sum"] / seen,
                "train_accuracy": self.totals["correct"] / seen, "seconds": self.totals["seconds"], "lr": lr}


class TimePace:
    """Training sized to a time budget (``fit(time_limit_s=...)``; notebook 05, ``make gpu-check``).

    The schedule's progress is the further of elapsed time / ``limit_s`` and steps / the planned steps: the
    scheduler is stepped up to that point of its curve (several times in one step when the loop is slower than
    planned, not at all when it is ahead), and training stops once progress reaches 1. So a OneCycle or piecewise
    schedule always completes, and the run ends on time whatever the plan guessed. Validation counts as time.
    Under DDP rank 0's progress is broadcast each step, so every rank uses the same rate and stops together.
    """

    clock = staticmethod(time.perf_counter)  # seconds; tests replace it with a clock they control

    def __init__(self, limit_s: float, planned_steps: int, scheduler=None, step_on: str = "batch",
                 steps_per_epoch: int = 1):
        self.limit_s, self.planned_steps, self.scheduler = max(float(limit_s), 1e-6), max(1, planned_steps), scheduler
        self.units = self.planned_steps if step_on == "batch" else max(1, self.planned_steps // steps_per_epoch)
        self.t0 = self.clock()

    def pause(self, seconds: float) -> None:
        """Leave ``seconds`` out of the budget (time spent on something that is not training)."""
        self.t0 += seconds

    def after_step(self, steps_done: int) -> bool:
        """Advance the schedule to this step's progress; True when training must stop."""
        progress = rank0_value(max((self.clock() - self.t0) / self.limit_s, steps_done / self.planned_steps))
        if self.scheduler is not None:
            target = min(int(progress * self.units), self.units - 1)
            while self.scheduler.last_epoch < target:
                self.scheduler.step()
        return progress >= 1.0


def rank0_value(value: float) -> float:
    """``value`` as rank 0 has it (under a multi-process group), else unchanged (notebook 05)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return value
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.broadcast(t, src=0)
    return float(t.item())


@dataclass
class _Loop:
    """What one ``fit`` call carries from step to step: the objects it trains and the options it was given."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    loss_fn: Callable
    device: torch.device
    amp: object
    scheduler: object = None
    scheduler_step: str = "epoch"
    grad_clip: float | None = None
    host_inputs: tuple = ()
    val_loader: object = None
    val_every: int | None = None
    checkpoint: Path | None = None   # where to write checkpoints (None: never write)
    checkpoint_every: int | None = None
    callback: Callable | None = None
    bar: object = None
    history: History = field(default_factory=History)
    iteration: int = 0
    pace: TimePace | None = None  # a time budget: the schedule follows it, and training stops at its end
    stopped: bool = False
    count_flops: bool = True
    work: dict | None = None      # the first step's counts (FLOPs per item, peak): set by _count_work

    def __post_init__(self):
        self.dtype = resolve_amp(self.amp, self.device)
        self.scaler = make_scaler(self.device, self.dtype)

    def snapshot(self, epoch: int, batch_in_epoch: int, epoch_rng: dict, totals: dict) -> dict:
        """Everything needed to continue exactly here: weights, optimizer, scheduler, scaler, RNG, history."""
        return {"format": CHECKPOINT_FORMAT, "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
                "scaler": self.scaler.state_dict(), "epoch": epoch, "batch_in_epoch": batch_in_epoch,
                "iteration": self.iteration, "history": self.history.state_dict(), "partial": dict(totals),
                "rng": rng_state(), "epoch_rng": epoch_rng}

    def restore(self, path: Path) -> tuple[int, int, dict, tuple]:
        """Load a ``snapshot``; return (epoch, batches done in it, the epoch's totals so far, RNG states)."""
        # Everything is loaded to the CPU: RNG states must stay there, and load_state_dict copies the weights and
        # the optimizer state onto the device of the parameters they belong to.
        state = load_checkpoint(path, map_location="cpu")
        if state.get("format") != CHECKPOINT_FORMAT:
            raise CheckpointError(f"{shown_path(path)} was not written by helpers.training.fit; cannot resume from it")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state["scheduler"] is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.history = History.from_state_dict(state["history"])
        self.iteration = state["iteration"]
        return state["epoch"], state["batch_in_epoch"], dict(state["partial"]), (state["epoch_rng"], state["rng"])

    def validate(self, epoch: int) -> None:
        result = evaluate(self.model, self.val_loader, self.device, loss_fn=self.loss_fn, amp=self.amp,
                          host_inputs=self.host_inputs)
        self.history.validation.append({"iteration": self.iteration, "epoch": epoch, "loss": result["loss"],
                                        "accuracy": result["accuracy"]})

    def after_step(self, meter: EpochMeter, b: int, per_epoch: int, epoch_rng: dict, loss: torch.Tensor) -> None:
        """Progress bar, validation and checkpoint cadence, and the caller's callback, after each step."""
        it, epoch = self.iteration, meter.epoch
        if self.bar is not None:
            self.bar.update(1)
            if it % 25 == 0:
                self.bar.set_postfix(epoch=epoch + 1, loss=f"{loss.item():.3f}")
        if self.val_loader is not None and self.val_every and it % self.val_every == 0:
            meter.flush(self.history)
            self.validate(epoch)
            meter.restart_clock()
        if self.checkpoint is not None and self.checkpoint_every and it % self.checkpoint_every == 0 \
                and b + 1 < per_epoch:
            meter.flush(self.history)
            save_checkpoint(self.checkpoint, self.snapshot(epoch, b + 1, epoch_rng, meter.totals))
            meter.restart_clock()
        if self.callback is not None:
            self.callback({"epoch": epoch, "batch": b, "iteration": it, "loss": loss})


def _start_epoch(loader, epoch: int, skip: int, resume_rng: tuple | None):
    """Set the samplers' epoch and, when resuming, replay the skipped batches under the saved RNG state."""
    for holder in (loader, getattr(loader, "batch_sampler", None), getattr(loader, "sampler", None)):
        if hasattr(holder, "set_epoch"):
            holder.set_epoch(epoch)
    if resume_rng is not None:
        set_rng_state(resume_rng[0])
    epoch_rng = rng_state()
    batches = iter(loader)
    for _ in range(skip):
        next(batches)  # replays the data order and augmentation draws of the interrupted epoch
    if resume_rng is not None:
        set_rng_state(resume_rng[1])
    return batches, epoch_rng


def _train_epoch(loop: _Loop, loader, meter: EpochMeter, skip: int = 0, resume_rng: tuple | None = None) -> None:
    """One pass over ``loader``: move each batch, take the step, let the loop do its bookkeeping."""
    batches, epoch_rng = _start_epoch(loader, meter.epoch, skip, resume_rng)
    per_epoch = len(loader)
    for b, batch in enumerate(batches, start=skip):
        if loop.count_flops and loop.work is None:
            _count_work(loop, batch, meter)
        inputs, target = split_batch(batch, loop.device, loop.host_inputs)
        lr = loop.optimizer.param_groups[0]["lr"]  # the rate this step uses
        out, loss = optimizer_step(loop.model, loop.optimizer, inputs, target, loss_fn=loop.loss_fn,
                                   scaler=loop.scaler, device=loop.device, dtype=loop.dtype, grad_clip=loop.grad_clip)
        if loop.scheduler is not None and loop.scheduler_step == "batch" and loop.pace is None:
            loop.scheduler.step()
        loop.iteration += 1
        meter.add(loss, out, target, lr)
        loop.after_step(meter, b, per_epoch, epoch_rng, loss)
        if loop.pace is not None and loop.pace.after_step(loop.iteration):
            loop.stopped = True
            break


def _count_work(loop: _Loop, batch, meter: EpochMeter) -> None:
    """Count one step's FLOPs (``helpers.counting.count_step``, on a copy, the RNG state kept) and look up the
    device's measured peak if it is cached (fit never stops to measure it: call
    ``helpers.ceilings.measured_ceilings`` first); the time it takes is not training time."""
    model = _unwrap(loop.model)
    paused = loop.pace.clock() if loop.pace is not None else 0.0
    model = getattr(model, "_orig_mod", model)  # a torch.compile'd model: count the eager one (same model FLOPs)
    try:
        with torch.random.fork_rng(devices=[loop.device] if loop.device.type == "cuda" else []):
            work = count_step(model, batch, loop.device, optimizer=loop.optimizer, loss_fn=loop.loss_fn,
                              amp=loop.amp, host_inputs=loop.host_inputs)
    except (RuntimeError, TypeError, ValueError, NotImplementedError) as err:  # counting is a by-product
        warnings.warn(f"fit could not count the step's FLOPs, so no MFU is recorded: {err}", stacklevel=3)
        loop.work = {}
    else:
        loop.work = {"flops_per_item": work.flops / max(work.items, 1), "dtype": main_dtype(work),
                     "ceilings": measured_ceilings(loop.device, measure=False)}
    meter.restart_clock()
    if loop.pace is not None:
        loop.pace.pause(loop.pace.clock() - paused)


def _throughput(loop: _Loop, record: dict, seen: int) -> None:
    """Add the epoch's model FLOP/s and MFU against the measured peak to ``record`` (when counted)."""
    if not loop.work or not record["seconds"] > 0:
        return
    record["flops_per_item"] = loop.work["flops_per_item"]
    record["flops_per_s"] = loop.work["flops_per_item"] * seen / record["seconds"]
    if loop.work["ceilings"]:
        found = mfu(record["flops_per_s"], loop.device, loop.work["dtype"], ceilings=loop.work["ceilings"])
        record["mfu"] = found["mfu"]
        record.update({k: found[k] for k in ("datasheet_mfu", "datasheet_gpu") if k in found})


def _end_epoch(loop: _Loop, meter: EpochMeter) -> None:
    """Flush the meter, step a per-epoch scheduler, validate, record the epoch, write the checkpoint."""
    meter.flush(loop.history)
    record = meter.record(loop.iteration, loop.optimizer.param_groups[0]["lr"])  # the rate the epoch ended at
    if loop.scheduler is not None and loop.scheduler_step == "epoch" and loop.pace is None:
        loop.scheduler.step()
    _throughput(loop, record, meter.totals["seen"])
    if loop.val_loader is not None and not loop.val_every:
        loop.validate(meter.epoch)
    if loop.history.validation and loop.history.validation[-1]["epoch"] == meter.epoch:
        record["val_loss"] = loop.history.validation[-1]["loss"]
        record["val_accuracy"] = loop.history.validation[-1]["accuracy"]
    loop.history.epochs.append(record)
    if loop.checkpoint is not None:
        save_checkpoint(loop.checkpoint, loop.snapshot(meter.epoch + 1, 0, rng_state(), EpochMeter(0, 0).totals))


def _open_checkpoint(loop: _Loop, checkpoint, resume: bool, save_checkpoints: bool) -> tuple:
    """Where ``fit`` starts: ``(epoch, batch in it, the epoch's totals, RNG states)`` from ``checkpoint`` when
    resuming, else the beginning (with a warning when an existing checkpoint will be overwritten)."""
    if checkpoint is not None and Path(checkpoint).exists():
        if resume:
            return loop.restore(Path(checkpoint))
        if save_checkpoints:
            warnings.warn(f"{checkpoint} exists and will be overwritten (pass resume=True to continue from it)",
                          stacklevel=3)
    return 0, 0, None, None


def fit(model: nn.Module, train_loader, *, epochs: int, optimizer: torch.optim.Optimizer, device="auto",
        loss_fn: Callable | None = None, val_loader=None, val_every: int | None = None, scheduler=None,
        scheduler_step: str = "epoch", amp=False, grad_clip: float | None = None, host_inputs=(),
        checkpoint: str | Path | None = None, checkpoint_every: int | None = None, resume: bool = False,
        save_checkpoints: bool = True, progress: bool = True, callback: Callable[[dict], None] | None = None,
        time_limit_s: float | None = None, count_flops: bool = True) -> History:
    """Train ``model`` for ``epochs`` and return its ``History`` (MATLAB ``trainnet``; notebooks 00 and 01).

    - ``device``: ``"auto" | "cpu" | "cuda[:N]" | "mps"``; model and batches are moved there.
    - ``val_loader`` is evaluated every ``val_every`` iterations, or at each epoch's end if ``val_every`` is None.
    - ``scheduler`` is stepped after every batch (``scheduler_step="batch"``) or every epoch (``"epoch"``).
    - ``amp``: ``False | True | "bf16" | "fp16"``; autocast wraps forward + loss only, a ``GradScaler`` is used for fp16.
    - ``host_inputs``: indices of inputs that stay on the CPU (sequence lengths for ``pack_padded_sequence``).
    - ``checkpoint``: file written atomically every ``checkpoint_every`` iterations and at each epoch's end;
      with ``resume=True`` an existing one is loaded and training continues exactly where it stopped
      (bit-identical on the CPU with ``num_workers=0`` and the global RNG seeded).
    - ``save_checkpoints=False`` reads ``checkpoint`` to resume but never writes it (DDP ranks other than 0).
    - ``time_limit_s``: a time budget (``TimePace``): ``epochs`` is the plan, the schedule follows the clock.
    - ``count_flops``: count the first step's FLOPs (not training time) so each epoch records ``flops_per_s`` and,
      once ``helpers.ceilings.measured_ceilings`` has measured this device, ``mfu`` (model FLOPs utilisation).
    """
    if scheduler_step not in ("batch", "epoch"):
        raise ValueError(f"scheduler_step must be 'batch' or 'epoch', not {scheduler_step!r}")
    device = pick_device(device)
    loop = _Loop(model.to(device), optimizer, loss_fn or nn.CrossEntropyLoss(), device, amp, scheduler,
                 scheduler_step, grad_clip, tuple(host_inputs), val_loader, val_every,
                 Path(checkpoint) if checkpoint is not None and save_checkpoints else None, checkpoint_every, callback,
                 count_flops=count_flops)
    start, skip, totals, resume_rng = _open_checkpoint(loop, checkpoint, resume, save_checkpoints)
    per_epoch = len(train_loader)
    loop.bar = tqdm(total=epochs * per_epoch, initial=start * per_epoch + skip, desc="training", unit="it") \
        if progress else None
    model.train()
    loop.pace = None if time_limit_s is None else TimePace(time_limit_s, epochs * per_epoch, scheduler,
                                                           scheduler_step, per_epoch)
    for epoch in range(start, epochs):
        meter = EpochMeter(epoch, loop.iteration, totals)
        _train_epoch(loop, train_loader, meter, skip, resume_rng)
        _end_epoch(loop, meter)
        skip, totals, resume_rng = 0, None, None
        if loop.stopped:
            loop.history.epochs[-1]["partial"] = loop.iteration % per_epoch != 0
            break
    loop.bar.close() if loop.bar is not None else None
    return loop.history
