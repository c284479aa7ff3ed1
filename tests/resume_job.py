"""A small deterministic training job for the kill-and-resume test (run as a subprocess).

Usage: python resume_job.py CHECKPOINT OUT.pt [--resume] [--pause SECONDS]
Prints "iteration N" after every optimizer step so the test knows when to kill it.
"""
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from helpers.training import fit, seed_everything


def main(argv):
    checkpoint, out = argv[0], argv[1]
    resume = "--resume" in argv
    pause = float(argv[argv.index("--pause") + 1]) if "--pause" in argv else 0.0
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
        time.sleep(pause)

    history = fit(model, loader, epochs=4, optimizer=opt, scheduler=sched, scheduler_step="batch",
                  checkpoint=checkpoint, checkpoint_every=5, resume=resume, progress=False, callback=report)
    torch.save({"model": model.state_dict(), "iterations": len(history.iterations)}, out)
    print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
