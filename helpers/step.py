"""One training step of the course, the plain PyTorch one: precision, loss scaler, batch to the device, the step;
and ``BOUNDS``, the course's names for what bounds a step (notebooks 00, 01, 09, 10).

Notebook 00 shows it; ``helpers.training.fit`` loops over it, and timing, counting, diagnosing and compiling a step
(``helpers.timing``, ``helpers.counting``, ``helpers.diagnose``, ``helpers.compiling``) call these same functions, so
the step measured is the step trained. It imports only ``helpers.devices``.
Batches are tuples ``(*inputs, target)``; the model is called as ``model(*inputs)``.
"""
from __future__ import annotations

from collections import defaultdict
from copy import deepcopy
from typing import Callable

import torch
from torch import nn

from .devices import half_precision, pick_device

# What bounds a training step: the course's one set of names, each with its fix and the lessons that teach it.
# Lesson 01 (section 5) defines compute, memory and overhead, lesson 03 transfer, lesson 04 input. Every module that
# names a bound (profiling.verdict, diagnose.classify, predictions.predict_step, operations.regime) uses these words.
BOUNDS = {
    "compute": ("make the arithmetic cheaper: mixed precision (lesson 06), torch.compile (lesson 08), a faster or a "
                "second device (lesson 05)", "lessons 05, 06 and 08"),
    "memory": ("move fewer bytes: fuse chains of elementwise operators (torch.compile, lesson 08), keep activations "
               "in 16 bits (mixed precision, lesson 06)", "lessons 06 and 08"),
    "overhead": ("give the device bigger pieces of work: a larger batch, fewer and fused operators (torch.compile), "
                 "CUDA graphs (lesson 08)", "lesson 08"),
    "input": ("feed the device faster: more DataLoader workers, augmentation batched on the device (lesson 04), each "
              "image decoded once and kept (lesson 10)", "lessons 04 and 10"),
    "transfer": ("copy less, or while the device computes: pinned memory with non_blocking copies, the data kept on "
                 "the device (lesson 03)", "lesson 03"),
}


def resolve_amp(amp, device: torch.device) -> torch.dtype | None:
    """Map ``False | True | "auto" | "bf16" | "fp16"`` to the autocast dtype for ``device`` (notebook 06).

    ``True``/``"auto"`` pick what the hardware runs natively (``helpers.devices.half_precision``), and *no*
    autocast on CPUs without bf16 instructions, where emulated bf16 is slower than fp32. ``"bf16"``/``"fp16"`` are
    taken as asked.
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


def channels_last_batch(batch) -> list:
    """The batch with its image tensors (4-D) in channels_last memory format, the rest as it is (notebook 06)."""
    return [x.contiguous(memory_format=torch.channels_last) if isinstance(x, torch.Tensor) and x.dim() == 4 else x
            for x in batch]


class PreparedStep:
    """A model, its optimizer, loss, precision and one batch, ready on a device (``train_step`` makes it).

    Calling it takes one training step (``optimizer_step``, the step ``fit`` takes) and returns the loss: on the
    prepared batch, already on the device, or on ``batch`` when given (moved first, as ``fit`` moves each batch).
    ``host`` is the batch as given, on the host (pinned if asked) (notebooks 02 and 03).
    """

    def __init__(self, model, optimizer, loss_fn, device, dtype, host, host_inputs):
        self.model, self.optimizer, self.loss_fn, self.device, self.dtype = model, optimizer, loss_fn, device, dtype
        self.scaler, self.host, self.host_inputs = make_scaler(device, dtype), host, tuple(host_inputs)
        self.inputs, self.target = split_batch(host, device, self.host_inputs)

    def __call__(self, batch=None) -> torch.Tensor:
        inputs, target = (self.inputs, self.target) if batch is None else split_batch(batch, self.device,
                                                                                      self.host_inputs)
        return optimizer_step(self.model, self.optimizer, inputs, target, loss_fn=self.loss_fn, scaler=self.scaler,
                              device=self.device, dtype=self.dtype)[1]


def train_step(model: nn.Module, optimizer, batch, device="auto", *, loss_fn=None, amp=False, host_inputs=(),
               channels_last: bool = False, copy: bool = False, pinned: bool = False) -> PreparedStep:
    """The one way the course prepares a training step: ``model`` and ``batch`` on ``device``, the optimizer, the
    precision and its loss scaler; returns a ``PreparedStep`` whose call is one full step (notebooks 02, 03).

    Timing, counting, diagnosing and compiling a step all call it (module docstring). ``optimizer``: an instance, a
    class or factory called with the parameters, or None for ``SGD(lr=0.01)``. ``copy=True`` steps a deep copy of
    model and optimizer (state cleared, settings kept), leaving yours untrained. ``channels_last`` converts model
    and images; ``pinned`` pins the host batch (notebook 03).
    """
    device, original = pick_device(device), optimizer
    if copy:  # the copied optimizer holds the copied parameters; its state is not copied (Adam's is 2x the model)
        held = optimizer.state if isinstance(optimizer, torch.optim.Optimizer) else None
        if held is not None:
            optimizer.state = defaultdict(dict)
        try:
            model, optimizer = deepcopy((model, optimizer))
        finally:
            if held is not None:
                original.state = held
    *inputs, target = batch
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        inputs = channels_last_batch(inputs)
    model.to(device).train()
    if not isinstance(optimizer, torch.optim.Optimizer):
        optimizer = (optimizer or (lambda params: torch.optim.SGD(params, lr=0.01)))(model.parameters())
    host = tuple(x.pin_memory() if pinned and isinstance(x, torch.Tensor) else x for x in (*inputs, target))
    return PreparedStep(model, optimizer, loss_fn or nn.CrossEntropyLoss(), device, resolve_amp(amp, device), host,
                        host_inputs)
