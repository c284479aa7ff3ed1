"""Learning-rate schedules by name, their curves, and an LR range test (taught in notebook 07).

Each schedule is a plain ``torch.optim.lr_scheduler`` object; ``make_scheduler`` only chooses one and
says whether it is stepped per batch or per epoch (MATLAB's ``LearnRateSchedule`` is per epoch).
"""
from __future__ import annotations

import math

import torch
from torch.optim import lr_scheduler

from .devices import pick_device
from .step import split_batch

SCHEDULES = ("constant", "piecewise", "cosine", "warmup_cosine", "onecycle")


def make_scheduler(name: str, optimizer, *, epochs: int, steps_per_epoch: int, drop_period: int | None = None,
                   drop_factor: float = 0.1, warmup_epochs: int = 1, eta_min: float = 0.0):
    """Return ``(scheduler, "batch" | "epoch")`` for a schedule named in ``SCHEDULES`` (notebook 07).

    - ``piecewise``: ``StepLR(step_size=drop_period, gamma=drop_factor)`` per epoch (MATLAB "piecewise");
    - ``cosine``: ``CosineAnnealingLR(T_max=epochs, eta_min)`` per epoch;
    - ``warmup_cosine``: linear warm-up over ``warmup_epochs`` then cosine to ``eta_min``, per batch;
    - ``onecycle``: ``OneCycleLR(max_lr=the optimizer's lr)`` per batch.
    """
    base = optimizer.param_groups[0]["lr"]
    total = epochs * steps_per_epoch
    if name == "constant":
        return lr_scheduler.LambdaLR(optimizer, lambda step: 1.0), "epoch"
    if name == "piecewise":
        return lr_scheduler.StepLR(optimizer, step_size=drop_period or max(1, epochs * 5 // 6), gamma=drop_factor), \
            "epoch"
    if name == "cosine":
        return lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs, eta_min=eta_min), "epoch"
    if name == "warmup_cosine":
        warm = max(1, warmup_epochs * steps_per_epoch)
        if warm >= total:
            raise ValueError(f"warm-up ({warm} steps) must be shorter than training ({total} steps)")
        first = lr_scheduler.LinearLR(optimizer, start_factor=1 / warm, end_factor=1.0, total_iters=warm)
        second = lr_scheduler.CosineAnnealingLR(optimizer, T_max=total - warm, eta_min=eta_min)
        return lr_scheduler.SequentialLR(optimizer, [first, second], milestones=[warm]), "batch"
    if name == "onecycle":
        return lr_scheduler.OneCycleLR(optimizer, max_lr=base, total_steps=total), "batch"
    raise ValueError(f"unknown schedule {name!r}: use one of {', '.join(SCHEDULES)}")


def lr_curve(name: str, *, lr: float, epochs: int, steps_per_epoch: int, step_on: str | None = None, **kwargs) -> list:
    """The learning rate used at every optimizer step (``epochs × steps_per_epoch`` values) for a schedule.
    (notebook 07)

    ``step_on`` overrides where the scheduler is stepped — "batch" for a per-epoch schedule reproduces the
    classic bug of stepping it every batch.
    """
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=lr)
    sched, natural = make_scheduler(name, opt, epochs=epochs, steps_per_epoch=steps_per_epoch, **kwargs)
    step_on = step_on or natural
    values = []
    for _ in range(epochs):
        for _ in range(steps_per_epoch):
            values.append(opt.param_groups[0]["lr"])
            opt.step()
            if step_on == "batch":
                sched.step()
        if step_on == "epoch":
            sched.step()
    return values


def cosine_closed_form(epoch: int, *, base_lr: float, eta_min: float, epochs: int) -> float:
    """The textbook formula: eta_min + (base_lr - eta_min) · (1 + cos(pi · epoch / epochs)) / 2 (notebook 07)."""
    return eta_min + (base_lr - eta_min) * (1 + math.cos(math.pi * epoch / epochs)) / 2


def lr_range_test(model, loader, *, device="cpu", start: float = 1e-5, end: float = 1.0, steps: int = 100,
                  loss_fn=None, momentum: float = 0.9) -> dict:
    """Raise the LR exponentially from ``start`` to ``end`` over ``steps`` batches and record the loss (notebook 07).

    Stops early when the loss exceeds 4× its best. Returns ``{"lr": [...], "loss": [...], "smoothed": [...]}``;
    a good peak LR is somewhat below where the smoothed loss is lowest. The model's weights change: use a copy.
    """
    device = pick_device(device)
    model.to(device).train()
    loss_fn = loss_fn or torch.nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=start, momentum=momentum)
    factor = (end / start) ** (1 / max(1, steps - 1))
    lrs, losses, smoothed, avg, best = [], [], [], 0.0, math.inf
    batches = iter(loader)
    for i in range(steps):
        try:
            batch = next(batches)
        except StopIteration:
            batches = iter(loader)
            batch = next(batches)
        inputs, target = split_batch(batch, device)
        loss = loss_fn(model(*inputs), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        value = loss.item()
        avg = 0.9 * avg + 0.1 * value
        smooth = avg / (1 - 0.9 ** (i + 1))
        lrs.append(opt.param_groups[0]["lr"])
        losses.append(value)
        smoothed.append(smooth)
        best = min(best, smooth)
        if not math.isfinite(value) or smooth > 4 * best:
            break
        for group in opt.param_groups:
            group["lr"] *= factor
    return {"lr": lrs, "loss": losses, "smoothed": smoothed}
