"""One training loop for the whole course: device, AMP, scheduler, metrics, progress, checkpoint/resume.

Notebook 00 introduces it; notebook 01 uses it first. The loop is the plain PyTorch one
(forward, loss, ``zero_grad``, ``backward``, ``step``) with the bookkeeping every lesson needs.
Batches are tuples ``(*inputs, target)``; the model is called as ``model(*inputs)``.
"""
from __future__ import annotations

import os
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

from .devices import pick_device

CHECKPOINT_FORMAT = "helpers.training/1"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used: truncated, corrupt, unsafe, or from another program."""


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's random generators (all devices) in one call."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def resolve_amp(amp, device: torch.device) -> torch.dtype | None:
    """Map ``False | True | "auto" | "bf16" | "fp16"`` to the autocast dtype for ``device`` (notebook 06)."""
    if amp is None or amp is False:
        return None
    if amp is True or amp == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float16 if device.type == "mps" else torch.bfloat16
    names = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}
    if isinstance(amp, torch.dtype) and amp in names.values():
        return amp
    if isinstance(amp, str) and amp.lower() in names:
        return names[amp.lower()]
    raise ValueError(f"amp={amp!r} is not understood: use False, True, 'auto', 'bf16' or 'fp16'")


@dataclass
class History:
    """What ``fit`` measured, as plain lists of dicts (JSON- and checkpoint-friendly)."""

    iterations: list = field(default_factory=list)   # {"iteration", "epoch", "loss", "lr"}
    validation: list = field(default_factory=list)   # {"iteration", "epoch", "loss", "accuracy"}
    epochs: list = field(default_factory=list)       # {"epoch", "train_loss", "train_accuracy", "seconds", ...}

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "History":
        return cls(**{k: list(d.get(k, [])) for k in ("iterations", "validation", "epochs")})

    @property
    def final(self) -> dict:
        """The last epoch's record (empty dict before the first epoch ends)."""
        return self.epochs[-1] if self.epochs else {}


# ---------------------------------------------------------------- batches and evaluation

def _to(x, device: torch.device):
    if isinstance(x, torch.Tensor):
        return x.to(device, non_blocking=x.is_pinned() if device.type == "cuda" else False)
    return x


def split_batch(batch, device: torch.device, host_inputs=()) -> tuple[list, torch.Tensor]:
    """Move a ``(*inputs, target)`` batch to ``device``, keeping the inputs numbered in ``host_inputs`` on the CPU."""
    *inputs, target = batch
    inputs = [x if i in host_inputs else _to(x, device) for i, x in enumerate(inputs)]
    return inputs, _to(target, device)


def _autocast(device: torch.device, dtype):
    return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)


def _unwrap(model: nn.Module) -> nn.Module:
    # A DDP wrapper's forward may start collectives (buffer broadcasts) that the other ranks would not join:
    # evaluation on one rank must call the plain module inside it.
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def evaluate(model: nn.Module, loader, device="cpu", *, loss_fn=None, amp=False, host_inputs=()) -> dict:
    """Mean loss and accuracy of ``model`` over ``loader`` without gradients (MATLAB ``testnet``; notebook 01)."""
    device = pick_device(device)
    model = _unwrap(model)
    loss_fn = loss_fn or nn.CrossEntropyLoss()
    dtype = resolve_amp(amp, device)
    was_training = model.training
    model.eval()
    loss_sum = torch.zeros((), device=device)
    correct = torch.zeros((), device=device, dtype=torch.long)
    count = 0
    with torch.inference_mode():
        for batch in loader:
            inputs, target = split_batch(batch, device, host_inputs)
            with _autocast(device, dtype):
                out = model(*inputs)
                loss = loss_fn(out.float(), target)
            loss_sum += loss * target.shape[0]
            correct += (out.argmax(1) == target).sum()
            count += target.shape[0]
    model.train(was_training)
    if count == 0:
        raise ValueError("evaluate() got an empty loader")
    return {"loss": loss_sum.item() / count, "accuracy": correct.item() / count, "count": count}


def predict(model: nn.Module, loader, device="cpu", *, host_inputs=(), amp=False) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores and targets for every batch, gathered on the CPU (MATLAB ``minibatchpredict``; notebook 01)."""
    device = pick_device(device)
    model = _unwrap(model)
    dtype = resolve_amp(amp, device)
    was_training = model.training
    model.eval()
    scores, targets = [], []
    with torch.inference_mode():
        for batch in loader:
            inputs, target = split_batch(batch, device, host_inputs)
            with _autocast(device, dtype):
                scores.append(model(*inputs).float())
            targets.append(target)
    model.train(was_training)
    return torch.cat(scores).cpu(), torch.cat(targets).cpu()


def _optimizer_step(model, optimizer, scaler, loss_fn, inputs, target, device, dtype, grad_clip=None):
    """Forward + loss under autocast, then backward, optional clipping and the (scaled) optimizer step."""
    with _autocast(device, dtype):
        out = model(*inputs)
        loss = loss_fn(out, target)
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    if grad_clip is not None:
        scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    return out, loss


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch, device="cpu", *, loss_fn=None, amp=False,
               host_inputs=()) -> Callable[[], torch.Tensor]:
    """One fixed batch, moved to ``device`` once; returns a function doing one full training step on it.

    The step is the one ``fit`` takes (a ``GradScaler`` with fp16 included), for timing compute alone
    (no data loading) with ``helpers.timing.time_fn`` (notebooks 01, 02, 06).
    """
    device = pick_device(device)
    model.to(device).train()
    loss_fn = loss_fn or nn.CrossEntropyLoss()
    dtype = resolve_amp(amp, device)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    inputs, target = split_batch(batch, device, host_inputs)
    return lambda: _optimizer_step(model, optimizer, scaler, loss_fn, inputs, target, device, dtype)[1]


# ---------------------------------------------------------------- checkpoints

def _rng_state() -> dict:
    np_state = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def previous_path(path: str | Path) -> Path:
    """Where the checkpoint before the latest one is kept: ``run.pt`` -> ``run.prev.pt``."""
    path = Path(path)
    return path.with_name(f"{path.stem}.prev{path.suffix}")


def save_checkpoint(path: str | Path, state: dict) -> Path:
    """Write ``state`` atomically: temp file, fsync, keep the old one as ``*.prev``, rename (notebook 00)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            torch.save(state, fh)
            fh.flush()
            os.fsync(fh.fileno())
        if path.exists():
            os.replace(path, previous_path(path))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def load_checkpoint(path: str | Path, map_location="cpu") -> dict:
    """Load a checkpoint with ``weights_only=True``; raise ``CheckpointError`` with the fix if unusable."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"GLOBAL ([\w.]+)", str(exc))
        what = (f"it asks to call or build {found.group(1)}" if found
                else "it holds objects other than tensors and plain data")
        raise CheckpointError(
            f"refused to load {path}: {what}. Loading it with weights_only=False would run code from the file; "
            "only do that for files you wrote yourself."
        ) from None
    except Exception as exc:  # truncated zip, bad magic number, short read ...
        prev = previous_path(path)
        hint = (f" The previous checkpoint {prev.name} is intact: rename it to {path.name} to resume from it."
                if prev.exists() else " Delete it to start over.")
        raise CheckpointError(f"checkpoint {path} is truncated or corrupt ({type(exc).__name__}).{hint}") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} is not a checkpoint written by helpers.training")
    return state


# ---------------------------------------------------------------- the loop

def fit(model: nn.Module, train_loader, *, epochs: int, optimizer: torch.optim.Optimizer, device="cpu",
        loss_fn: Callable | None = None, val_loader=None, val_every: int | None = None, scheduler=None,
        scheduler_step: str = "epoch", amp=False, grad_clip: float | None = None, host_inputs=(),
        checkpoint: str | Path | None = None, checkpoint_every: int | None = None, resume: bool = False,
        extra: dict | None = None, save_checkpoints: bool = True, progress: bool = True,
        callback: Callable[[dict], None] | None = None) -> History:
    """Train ``model`` for ``epochs`` and return its ``History`` (MATLAB ``trainnet``; notebooks 00 and 01).

    - ``device``: ``"auto" | "cpu" | "cuda[:N]" | "mps"``; model and batches are moved there.
    - ``val_loader`` is evaluated every ``val_every`` iterations, or at each epoch's end if ``val_every`` is None.
    - ``scheduler`` is stepped after every batch (``scheduler_step="batch"``) or every epoch (``"epoch"``).
    - ``amp``: ``False | True | "bf16" | "fp16"``; autocast wraps forward + loss only, a ``GradScaler`` is used for fp16.
    - ``host_inputs``: indices of inputs that stay on the CPU (sequence lengths for ``pack_padded_sequence``).
    - ``checkpoint``: file written atomically every ``checkpoint_every`` iterations and at each epoch's end;
      with ``resume=True`` an existing one is loaded and training continues exactly where it stopped
      (bit-identical on the CPU with ``num_workers=0`` and the global RNG seeded).
    - ``extra``: plain data stored in the checkpoint beside the weights (e.g. the label encoder's classes).
    - ``save_checkpoints=False`` reads ``checkpoint`` to resume but never writes it (DDP ranks other than 0).
    """
    if scheduler_step not in ("batch", "epoch"):
        raise ValueError(f"scheduler_step must be 'batch' or 'epoch', not {scheduler_step!r}")
    device = pick_device(device)
    model.to(device)
    loss_fn = loss_fn or nn.CrossEntropyLoss()
    dtype = resolve_amp(amp, device)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    history = History()
    start_epoch, skip, iteration = 0, 0, 0
    partial = {"loss_sum": 0.0, "correct": 0, "seen": 0, "seconds": 0.0}
    resume_rng = None
    if checkpoint is not None and resume and Path(checkpoint).exists():
        state = load_checkpoint(checkpoint, map_location=device)
        if state.get("format") != CHECKPOINT_FORMAT:
            raise CheckpointError(f"{checkpoint} was not written by helpers.training.fit; cannot resume from it")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        if scheduler is not None and state["scheduler"] is not None:
            scheduler.load_state_dict(state["scheduler"])
        scaler.load_state_dict(state["scaler"])
        history = History.from_dict(state["history"])
        start_epoch, skip, iteration = state["epoch"], state["batch_in_epoch"], state["iteration"]
        partial = dict(state["partial"])
        resume_rng = (state["epoch_rng"], state["rng"])
    elif checkpoint is not None and save_checkpoints and not resume and Path(checkpoint).exists():
        warnings.warn(f"{checkpoint} exists and will be overwritten (pass resume=True to continue from it)",
                      stacklevel=2)

    def snapshot(epoch: int, batch_in_epoch: int, epoch_rng: dict) -> dict:
        return {"format": CHECKPOINT_FORMAT, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict() if scheduler is not None else None,
                "scaler": scaler.state_dict(), "epoch": epoch, "batch_in_epoch": batch_in_epoch,
                "iteration": iteration, "history": history.as_dict(), "partial": dict(partial),
                "rng": _rng_state(), "epoch_rng": epoch_rng, "extra": extra or {}}

    def validate(epoch: int) -> None:
        result = evaluate(model, val_loader, device, loss_fn=loss_fn, amp=amp, host_inputs=host_inputs)
        history.validation.append({"iteration": iteration, "epoch": epoch, "loss": result["loss"],
                                   "accuracy": result["accuracy"]})

    per_epoch = len(train_loader)
    bar = tqdm(total=epochs * per_epoch, initial=start_epoch * per_epoch + skip, disable=not progress,
               desc="training", unit="it")
    model.train()
    for epoch in range(start_epoch, epochs):
        for holder in (getattr(train_loader, "batch_sampler", None), getattr(train_loader, "sampler", None)):
            if hasattr(holder, "set_epoch"):
                holder.set_epoch(epoch)
        if resume_rng is not None:
            _set_rng_state(resume_rng[0])
        epoch_rng = _rng_state()
        batches = iter(train_loader)
        for _ in range(skip):
            next(batches)  # replays the data order and augmentation draws of the interrupted epoch
        if resume_rng is not None:
            _set_rng_state(resume_rng[1])
            resume_rng = None
        # per step, only references are kept; flush() turns them into numbers with one device->host copy each
        losses, corrects, sizes, lrs, first_iteration = [], [], [], [], iteration
        t0 = time.perf_counter()

        def flush() -> None:
            nonlocal losses, corrects, sizes, lrs, first_iteration, t0
            values = torch.stack(losses).tolist() if losses else []
            for i, value in enumerate(values):
                history.iterations.append({"iteration": first_iteration + i + 1, "epoch": epoch, "loss": value,
                                           "lr": lrs[i]})
            partial["loss_sum"] += sum(v * n for v, n in zip(values, sizes))
            partial["correct"] += int(torch.stack(corrects).sum().item()) if corrects else 0
            partial["seen"] += sum(sizes)
            partial["seconds"] += time.perf_counter() - t0
            losses, corrects, sizes, lrs, first_iteration = [], [], [], [], iteration
            t0 = time.perf_counter()

        for b, batch in enumerate(batches, start=skip):
            inputs, target = split_batch(batch, device, host_inputs)
            lrs.append(optimizer.param_groups[0]["lr"])  # the rate this step uses
            out, loss = _optimizer_step(model, optimizer, scaler, loss_fn, inputs, target, device, dtype, grad_clip)
            if scheduler is not None and scheduler_step == "batch":
                scheduler.step()
            iteration += 1
            detached = loss.detach()
            losses.append(detached)
            corrects.append((out.detach().argmax(1) == target).sum())
            sizes.append(target.shape[0])
            bar.update(1)
            if progress and iteration % 25 == 0:
                bar.set_postfix(epoch=epoch + 1, loss=f"{detached.item():.3f}")
            if val_loader is not None and val_every and iteration % val_every == 0:
                flush()
                validate(epoch)
                t0 = time.perf_counter()  # validation time is not training time
            if checkpoint is not None and save_checkpoints and checkpoint_every and iteration % checkpoint_every == 0 \
                    and b + 1 < per_epoch:
                flush()
                save_checkpoint(checkpoint, snapshot(epoch, b + 1, epoch_rng))
                t0 = time.perf_counter()
            if callback is not None:
                callback({"epoch": epoch, "batch": b, "iteration": iteration, "loss": detached})
        flush()
        if scheduler is not None and scheduler_step == "epoch":
            scheduler.step()
        record = {"epoch": epoch + 1, "iteration": iteration,
                  "train_loss": partial["loss_sum"] / max(partial["seen"], 1),
                  "train_accuracy": partial["correct"] / max(partial["seen"], 1),
                  "seconds": partial["seconds"], "lr": optimizer.param_groups[0]["lr"]}
        if val_loader is not None and not val_every:
            validate(epoch)
        if history.validation and history.validation[-1]["epoch"] == epoch:
            record["val_loss"] = history.validation[-1]["loss"]
            record["val_accuracy"] = history.validation[-1]["accuracy"]
        history.epochs.append(record)
        partial = {"loss_sum": 0.0, "correct": 0, "seen": 0, "seconds": 0.0}
        skip = 0
        if checkpoint is not None and save_checkpoints:
            save_checkpoint(checkpoint, snapshot(epoch + 1, 0, _rng_state()))
    bar.close()
    return history
