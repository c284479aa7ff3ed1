"""Memory per rank of DDP against FSDP2's ``fully_shard``: the per-rank program and its launcher (notebook 09).

Each rank trains the same multi-layer perceptron twice on its own slice of data, first replicated with
``DistributedDataParallel`` (every rank holds all parameters, gradients and optimizer state), then sharded with
``torch.distributed.fsdp.fully_shard`` (each rank holds 1/world of them and all-gathers a layer's parameters only
while it computes that layer). It records, per rank, the megabytes held between steps and the peak during a step,
and rank 0 writes them with both runs' losses to a JSON file::

    torchrun --standalone --nproc_per_node=2 -m helpers.sharding --device cpu --out build/sharding.json

On CPU processes the backend is gloo; on GPUs (one per rank) nccl.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
from torch import nn

from .results import atomic_write_text

ENTRY_POINT = "helpers.sharding"


def _parse(argv):
    ap = argparse.ArgumentParser(prog="python -m helpers.sharding", description="DDP vs fully_shard: memory per rank")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--width", type=int, default=1024, help="features of each hidden layer")
    ap.add_argument("--layers", type=int, default=8, help="hidden layers (each one FSDP unit)")
    ap.add_argument("--batch-size", type=int, default=32, help="per rank")
    ap.add_argument("--steps", type=int, default=3, help="Adam steps before measuring")
    ap.add_argument("--out", help="results JSON (written by rank 0)")
    return ap.parse_args(argv)


def make_mlp(width: int, layers: int, n_classes: int = 10) -> nn.Sequential:
    """``layers`` blocks of Linear(width, width) + ReLU, then a classifier: parameters dominate its memory (notebook 09)."""
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(layers)],
                         nn.Linear(width, n_classes))


def wrap(model: nn.Sequential, mode: str, device: torch.device) -> nn.Module:
    """Replicate ``model`` with DDP, or shard it with ``fully_shard`` block by block, then the root (notebook 09)."""
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, device_ids=[device.index] if device.type == "cuda" else None, gradient_as_bucket_view=True)
    from torch.distributed.fsdp import fully_shard

    for block in model[:-1]:
        fully_shard(block)
    fully_shard(model)
    return model


def _peak_mb(net: nn.Module, opt, step, device: torch.device) -> float:
    """Peak MB of one step on this rank: CUDA statistics, or on a CPU what existed plus the profiler's peak."""
    from .profiling import profiler_peak_mb, tensor_mb

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        step()
        return torch.cuda.max_memory_allocated(device) / 2**20
    return tensor_mb(net, opt) + profiler_peak_mb(step)


def run_mode(mode: str, args, rank: int, world: int, device: torch.device) -> dict:
    """Train with ``mode`` ("ddp" or "fsdp") and measure this rank's memory (notebook 09)."""
    import torch.distributed as dist

    from .profiling import tensor_mb

    torch.manual_seed(0)  # the same initial weights on every rank and in both modes
    net = wrap(make_mlp(args.width, args.layers).to(device), mode, device)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(100 + rank)  # this rank's data, the same in both modes
    x = torch.randn(args.batch_size, args.width, generator=g).to(device)
    y = torch.randint(0, 10, (args.batch_size,), generator=g).to(device)
    losses = []

    def step():
        loss = nn.functional.cross_entropy(net(x), y)
        opt.zero_grad(set_to_none=False)  # keep gradients allocated between steps, as most training loops do
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / world)

    for _ in range(args.steps):
        step()
    held = tensor_mb(net, opt)
    peak = _peak_mb(net, opt, step, device)
    return {"rank": rank, "held_mb": held, "peak_mb": peak, "losses": losses}


def main(argv=None) -> int:
    """The torchrun entry point: DDP then fully_shard on this rank, rank 0 writes the comparison (notebook 09)."""
    import torch.distributed as dist

    args = _parse(argv)
    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                            device_id=device if device.type == "cuda" else None)
    try:
        found = {}
        for mode in ("ddp", "fsdp"):
            mine = run_mode(mode, args, rank, world, device)
            gathered = [None] * world
            dist.all_gather_object(gathered, mine)
            found[mode] = gathered
        if rank == 0:
            _report(args, world, dist.get_backend(), found)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


def _report(args, world: int, backend: str, found: dict) -> None:
    params = sum(p.numel() for p in make_mlp(args.width, args.layers).parameters())
    record = {"world_size": world, "backend": backend, "device": args.device, "width": args.width,
              "layers": args.layers, "parameters": params, "parameters_mb": params * 4 / 2**20,
              "ddp": found["ddp"], "fsdp": found["fsdp"],
              "max_loss_difference": max(abs(a - b) for a, b in zip(found["ddp"][0]["losses"],
                                                                  found["fsdp"][0]["losses"]))}
    for mode in ("ddp", "fsdp"):
        print(f"{mode}: " + ", ".join(f"rank {r['rank']} holds {r['held_mb']:.1f} MB, peak {r['peak_mb']:.1f} MB"
                                      for r in found[mode]), flush=True)
    if args.out:
        atomic_write_text(Path(args.out), json.dumps(record, indent=1) + "\n")


def compare(nproc: int, out: str | Path, *, device: str = "cpu", width: int = 1024, layers: int = 8,
            batch_size: int = 32, steps: int = 3, timeout: float = 600, echo: bool = True) -> dict:
    """Launch ``torchrun -m helpers.sharding`` on ``nproc`` ranks and return rank 0's JSON record (notebook 09)."""
    from . import launcher

    launcher.launch(nproc, ["--width", width, "--layers", layers, "--batch-size", batch_size, "--steps", steps,
                            "--out", Path(out).resolve()], device=device, timeout=timeout, echo=echo,
                    module=ENTRY_POINT)
    return json.loads(Path(out).read_text())


if __name__ == "__main__":
    sys.exit(main())
