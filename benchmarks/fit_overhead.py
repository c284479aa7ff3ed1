"""Overhead of helpers.training.fit against a bare hand-written PyTorch loop (CPU, one run, interleaved).

Both loops train the same MLP on the same synthetic data with the same data order and record the same
things a learner's loop records (per-iteration loss, running accuracy); fit also keeps its history and
drives a progress bar (written to a discarded stream here). Median of REPS repetitions; the last line is
the ratio fit / bare (goal: <= 1.05).
"""
import io
import statistics
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from helpers.training import fit

REPS, EPOCHS, BATCH = 11, 5, 64


def make():
    torch.manual_seed(0)
    x = torch.randn(4096, 64)
    y = (x[:, :10].argmax(1)).long()
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return model, opt, DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True)


def bare():
    model, opt, loader = make()
    loss_fn = nn.CrossEntropyLoss()
    losses, correct, seen = [], 0, 0
    t0 = time.perf_counter()
    for _ in range(EPOCHS):
        for xb, yb in loader:
            out = model(xb)
            loss = loss_fn(out, yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            correct += (out.argmax(1) == yb).sum().item()
            seen += yb.shape[0]
    return time.perf_counter() - t0


def helper(progress: bool):
    model, opt, loader = make()
    t0 = time.perf_counter()
    if progress:  # the bar draws to a discarded stream so the terminal does not pay for it
        sys_stderr, sys.stderr = sys.stderr, io.StringIO()
    try:
        fit(model, loader, epochs=EPOCHS, optimizer=opt, device="cpu", progress=progress)  # the bare loop runs there too
    finally:
        if progress:
            sys.stderr = sys_stderr
    return time.perf_counter() - t0


def main():
    torch.set_num_threads(1)
    times = {"bare loop": [], "fit (no bar)": [], "fit (progress bar)": []}
    bare(), helper(False)  # warm-up
    for _ in range(REPS):
        times["bare loop"].append(bare())
        times["fit (no bar)"].append(helper(False))
        times["fit (progress bar)"].append(helper(True))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"torch {torch.__version__}, 1 thread, {REPS} interleaved repetitions of {EPOCHS} epochs "
          f"x {4096 // BATCH} iterations")
    for k, v in med.items():
        print(f"{k:20s} median {v:.3f} s  (min {min(times[k]):.3f}, max {max(times[k]):.3f})")
    print(f"fit with progress bar / bare: {med['fit (progress bar)'] / med['bare loop']:.3f}")
    print(f"fit / bare loop: {med['fit (no bar)'] / med['bare loop']:.3f}")


if __name__ == "__main__":
    main()
