"""One training step of the course, the plain PyTorch one: precision, loss scaler, batch to the device, the step.

Notebook 00 shows it; ``helpers.training.fit`` loops over it, and timing, counting, diagnosing and compiling a step
(``helpers.timing``, ``helpers.counting``, ``helpers.diagnose``, ``helpers.regimes``) call these same functions, so
the step measured is the step trained. It imports only ``helpers.devices``.
Batches are tuples ``(*inputs, target)``; the model is called as ``model(*inputs)``.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from .devices import half_precision, pick_device


def resolve_amp(amp, device: torch.device) -> torch.dtype | None:
    """Map ``False | True | "auto" | "bf16" | "fp16"`` to the autocast dtype for ``device`` (notebook 06).

    ``True``/``"auto"`` pick what the hardware runs natively (``helpers.devices.half_precision``: bf16 on NVIDIA
    GPUs of compute capability >= 8.0, else fp16; fp16 on Apple GPUs; bf16 on CPUs with bf16 instructions and *no*
    autocast on other CPUs, where emulated bf16 is slower than fp32). ``"bf16"``/``"fp16"`` are taken as asked.
    """
    if amp is None or amp is False:
        return None
    if amp is True or amp == "auto":
        return half_precision(device)
    names = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}
    if isinstance(amp, torch.dtype) and amp in names.values():
        return amp
    if isinstance(amp, str) and amp.lower() in names:
        return names[amp.lower()]
    raise ValueError(f"amp={amp!r} is not understood: use False, True, 'auto', 'bf16' or 'fp16'")


def _to(x, device: torch.device):
    # Host-to-GPU copies are always non_blocking: from pinned memory the copy overlaps with what the host does next;
    # from pageable memory it still skips a per-copy synchronisation (notebook 03 measures both).
    if isinstance(x, torch.Tensor):
        return x.to(device, non_blocking=device.type == "cuda")
    return x


def split_batch(batch, device: torch.device, host_inputs=()) -> tuple[list, torch.Tensor]:
    """Move a ``(*inputs, target)`` batch to ``device``, keeping the inputs numbered in ``host_inputs`` on the CPU.
    (notebook 01)"""
    *inputs, target = batch
    inputs = [x if i in host_inputs else _to(x, device) for i, x in enumerate(inputs)]
    return inputs, _to(target, device)


def optimizer_step(model: nn.Module, optimizer: torch.optim.Optimizer, inputs: list, target: torch.Tensor, *,
                   loss_fn: Callable, scaler: torch.amp.GradScaler, device: torch.device, dtype=None,
                   grad_clip: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One training step, the textbook loop: forward + loss under autocast, backward, step (notebook 00).

    Autocast wraps the forward pass and the loss only. ``scaler`` multiplies the loss before ``backward`` and
    divides the gradients before the step; it is a pass-through unless the dtype is fp16 (notebook 06).
    """
    with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
        out = model(*inputs)
        loss = loss_fn(out, target)
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    if grad_clip is not None:
        scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
        nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    return out, loss


def make_scaler(device: torch.device, dtype) -> torch.amp.GradScaler:
    """A ``GradScaler`` that is active only for fp16 autocast (bf16 and fp32 need no loss scaling) (notebook 06)."""
    return torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch, device="auto", *, loss_fn=None, amp=False,
               host_inputs=()) -> Callable[[], torch.Tensor]:
    """One fixed batch, moved to ``device`` once; returns a function doing one full training step on it.

    The step is the one ``fit`` takes (``optimizer_step``, a ``GradScaler`` with fp16 included), for timing
    compute alone (no data loading) with ``helpers.timing.time_fn`` (notebooks 01, 02, 06).
    """
    device = pick_device(device)
    model.to(device).train()
    loss_fn = loss_fn or nn.CrossEntropyLoss()
    dtype = resolve_amp(amp, device)
    scaler = make_scaler(device, dtype)
    inputs, target = split_batch(batch, device, host_inputs)
    return lambda: optimizer_step(model, optimizer, inputs, target, loss_fn=loss_fn, scaler=scaler, device=device,
                                  dtype=dtype)[1]
