"""A small deterministic training job for the kill-and-resume test (run as a subprocess).

Usage: python resume_job.py CHECKPOINT OUT.pt [--resume] [--die-at N]
Prints "iteration N" after every optimizer step; with --die-at N it sends itself SIGKILL right after step N, so the
kill lands at the same step on any machine (a parent reading the output and killing it could be late).
"""
import os
import signal
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from helpers.training import fit, seed_everything


def main(argv):
    checkpoint, out = argv[0], argv[1]
    resume = "--resume" in argv
    die_at = int(argv[argv.index("--die-at") + 1]) if "--die-at" in argv else None
    torch.set_num_threads(1)
    seed_everything(0)
    x = torch.randn(96, 8)
    y = (x[:, 0] + x[:, 1] > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)  # global RNG decides the order
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)

    def report(info):
        print(f"iteration {info['iteration']}", flush=True)
        if info["iteration"] == die_at:
            os.kill(os.getpid(), signal.SIGKILL)

    history = fit(model, loader, epochs=4, optimizer=opt, scheduler=sched, scheduler_step="batch",
                  checkpoint=checkpoint, checkpoint_every=5, resume=resume, progress=False, callback=report)
    torch.save({"model": model.state_dict(), "iterations": len(history.iterations)}, out)
    print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
