"""Memory per rank of DDP against FSDP2's ``fully_shard``: the per-rank program and its launcher (notebooks 09, 11).

    torchrun --standalone --nproc_per_node=2 -m helpers.sharding --device cpu --out build/sharding.json
    torchrun --standalone --nproc_per_node=2 -m helpers.sharding --model gpt --width 128 --layers 4 --out g.json

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

from . import launcher
from .devices import synchronize
from .gpt import GPT, GPTConfig, lm_loss
from .profiling import peak_mb, tensor_mb
from .results import atomic_write_text

ENTRY_POINT = "helpers.sharding"


def _parse(argv):
    ap = argparse.ArgumentParser(prog="python -m helpers.sharding", description="DDP vs fully_shard: memory per rank")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--model", choices=["mlp", "gpt"], default="mlp", help="notebook 09's MLP or notebook 11's GPT")
    ap.add_argument("--width", type=int, default=1024, help="features of each hidden layer (GPT: d_model)")
    ap.add_argument("--layers", type=int, default=8, help="hidden layers or GPT blocks (each one FSDP unit)")
    ap.add_argument("--heads", type=int, default=4, help="GPT: attention heads")
    ap.add_argument("--seq-len", type=int, default=64, help="GPT: tokens per window")
    ap.add_argument("--vocab", type=int, default=65, help="GPT: vocabulary (65: Tiny Shakespeare's characters)")
    ap.add_argument("--batch-size", type=int, default=32, help="per rank")
    ap.add_argument("--steps", type=int, default=3, help="optimizer steps before measuring (the last ones timed)")
    ap.add_argument("--out", help="results JSON (written by rank 0)")
    return ap.parse_args(argv)


def make_mlp(width: int, layers: int, n_classes: int = 10) -> nn.Sequential:
    """``layers`` blocks of Linear(width, width) + ReLU, then a classifier: parameters dominate its memory (notebook 09)."""
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(layers)],
                         nn.Linear(width, n_classes))


def gpt_config(args):
    """The ``helpers.gpt.GPTConfig`` that ``--model gpt`` trains: ``--width`` is d_model, ``--layers`` the blocks.
    (notebook 11)"""
    return GPTConfig(vocab=args.vocab, seq_len=args.seq_len, d_model=args.width, n_layers=args.layers,
                     n_heads=args.heads)


def make_model(args) -> nn.Module:
    """The model ``args`` name: the MLP (notebook 09) or ``helpers.gpt.GPT`` (notebook 11)."""
    if args.model == "gpt":
        return GPT(gpt_config(args))
    return make_mlp(args.width, args.layers)


def wrap(model: nn.Module, mode: str, device: torch.device) -> nn.Module:
    """Replicate ``model`` with DDP, or shard it with ``fully_shard`` block by block, then the root (notebooks 09, 11).

    A GPT's blocks are its units; its token embedding, its output matrix (the same tied parameter), the position
    table and the last LayerNorm stay in the root unit, so the tied pair is one sharded parameter, gathered once.
    """
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, device_ids=[device.index] if device.type == "cuda" else None, gradient_as_bucket_view=True)
    from torch.distributed.fsdp import fully_shard

    for block in (model.blocks if hasattr(model, "blocks") else model[:-1]):
        fully_shard(block)
    fully_shard(model)
    return model


def _batch(args, rank: int, device: torch.device) -> tuple:
    """This rank's fixed batch (the same in both modes) and the loss: random features and classes for the MLP,
    random token windows and their next tokens for the GPT."""
    g = torch.Generator().manual_seed(100 + rank)
    if args.model == "gpt":
        x = torch.randint(0, args.vocab, (args.batch_size, args.seq_len + 1), generator=g)
        return x[:, :-1].to(device), x[:, 1:].to(device), lm_loss
    x = torch.randn(args.batch_size, args.width, generator=g).to(device)
    y = torch.randint(0, 10, (args.batch_size,), generator=g).to(device)
    return x, y, nn.functional.cross_entropy


def state_mb(net: nn.Module, opt) -> dict:
    """MB of parameters, gradients and optimizer state this rank holds, the local shard of a sharded tensor; a
    tied parameter counts once (notebook 11)."""
    def local(t):
        t = t.to_local() if hasattr(t, "to_local") else t
        return t.numel() * t.element_size() / 2**20

    params = list(net.parameters())  # yields a tied parameter once
    found = {"params_mb": sum(local(p) for p in params),
             "grads_mb": sum(local(p.grad) for p in params if p.grad is not None),
             "optimizer_mb": sum(local(v) for s in opt.state.values() for v in s.values()
                                 if torch.is_tensor(v) and v.dim() > 0)}
    found["state_mb"] = sum(found.values())
    return found


def run_mode(mode: str, args, rank: int, world: int, device: torch.device) -> dict:
    """Train with ``mode`` ("ddp" or "fsdp") and measure this rank's memory and step time (notebooks 09, 11).

    The MLP trains with Adam, the GPT with AdamW as notebook 11 does. ``step_ms`` is the median of the steps after
    the first; each step ends by reading its all-reduced loss (``.item()``), so the clock stops after its
    collectives. ``tied`` (GPT only): whether the output matrix is still the token embedding after wrapping."""
    import statistics
    import time

    import torch.distributed as dist

    torch.manual_seed(0)  # the same initial weights on every rank and in both modes
    net = wrap(make_model(args).to(device), mode, device)
    inner = getattr(net, "module", net)  # DDP's wrapped model
    tied = inner.head.weight is inner.tok.weight if args.model == "gpt" else None  # the GPT's one matrix, still one?
    opt = (torch.optim.AdamW if args.model == "gpt" else torch.optim.Adam)(net.parameters(), lr=1e-3)
    x, y, loss_fn = _batch(args, rank, device)  # this rank's data, the same in both modes
    losses, times = [], []

    def step():
        loss = loss_fn(net(x), y)
        opt.zero_grad(set_to_none=False)  # keep gradients allocated between steps, as most training loops do
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / world)

    for _ in range(args.steps):
        synchronize(device)
        tick = time.perf_counter()
        step()
        times.append(time.perf_counter() - tick)
    held = tensor_mb(net, opt)
    peak = peak_mb(step, device, held=(net, opt))
    return {"rank": rank, "held_mb": held, "peak_mb": peak, "losses": losses, **state_mb(net, opt),
            "step_ms": 1e3 * statistics.median(times[1:] or times), "tied": tied}


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
    params = sum(p.numel() for p in make_model(args).parameters())  # a tied parameter once
    record = {"world_size": world, "backend": backend, "device": args.device, "model": args.model,
              "width": args.width, "layers": args.layers, "parameters": params, "parameters_mb": params * 4 / 2**20,
              "gpt_config": vars(gpt_config(args)) if args.model == "gpt" else None, "steps": args.steps,
              "ddp": found["ddp"], "fsdp": found["fsdp"],
              "max_loss_difference": max(abs(a - b) for a, b in zip(found["ddp"][0]["losses"],
                                                                  found["fsdp"][0]["losses"]))}
    for mode in ("ddp", "fsdp"):
        print(f"{mode}: " + ", ".join(f"rank {r['rank']} holds {r['held_mb']:.1f} MB, peak {r['peak_mb']:.1f} MB, "
                                      f"{r['step_ms']:.1f} ms/step" for r in found[mode]), flush=True)
    if args.out:
        atomic_write_text(Path(args.out), json.dumps(record, indent=1) + "\n")


def compare(nproc: int, out: str | Path, *, device: str = "cpu", width: int = 1024, layers: int = 8,
            batch_size: int = 32, steps: int = 3, timeout: float = 600, echo: bool = True, model: str = "mlp",
            gpt_config=None) -> dict:
    """Launch ``torchrun -m helpers.sharding`` on ``nproc`` ranks and return rank 0's JSON record (notebooks 09, 11).

    ``model="gpt"`` trains ``helpers.gpt.GPT(gpt_config)`` (its d_model and blocks replace ``width`` and ``layers``)
    on random windows of ``gpt_config.seq_len`` tokens with AdamW; the default trains notebook 09's MLP with Adam.
    """
    shape = ["--width", width, "--layers", layers]
    if model == "gpt":
        c = gpt_config
        shape = ["--model", "gpt", "--width", c.d_model, "--layers", c.n_layers, "--heads", c.n_heads,
                 "--seq-len", c.seq_len, "--vocab", c.vocab]
    launcher.launch(nproc, [*shape, "--batch-size", batch_size, "--steps", steps, "--out", Path(out).resolve()],
                    device=device, timeout=timeout, echo=echo, module=ENTRY_POINT)
    return json.loads(Path(out).read_text())


if __name__ == "__main__":
    sys.exit(main())
