"""The per-rank entry point of data-parallel training with DDP (taught in notebook 05).

Run by ``torchrun`` (each process is one *rank*; torchrun sets RANK, LOCAL_RANK, WORLD_SIZE)::

    torchrun --standalone --nproc_per_node=2 -m helpers.distributed --data cifar.pt --epochs 2 --out run.json

The same command with ``--device cuda`` uses one GPU per rank (backend ``nccl``); with ``--device cpu`` each
rank is a CPU process (backend ``gloo``). Several machines: ``--nnodes=2 --rdzv_backend=c10d
--rdzv_endpoint=HOST:PORT`` on each. From Python (a notebook), ``helpers.launcher.launch`` starts torchrun.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch

from .cifar10 import (
    DeviceLoader,
    ImageSet,
    ImageTensorDataset,
    cifar10_transform,
    input_images_per_s,
    normalize,
    synthetic_images,
)
from .devices import float32_precision
from .models import CompactNet, ConvBlockNet
from .results import atomic_write_text
from .schedules import make_scheduler
from .step import resolve_amp
from .timing import time_train_step
from .training import evaluate, fit, flip_accuracy, rank0_value, seed_everything

REFERENCE_BATCH = 256   # --base-lr is the rate for this global batch; the linear scaling rule scales from it
SUBSET_SEED = 1234      # --train-limit: the same random training subset on every rank and every run
VAL_SUBSET_SEED = 4321  # --val-limit: the same random validation subset (every class, as in the test set)
EVAL_BATCH = 512        # batch size for validation and the final test (no gradients: larger is fine)
BUDGET_SAFETY = 0.92    # --budget-min: plan for 92 % of the budget: the real loop has overheads the timed step has
#                         not (measured: 23.5 s per epoch where _budget_epochs plans 22.4 s, CompactNet in bf16 on an
#                         AVX-512 BF16 EPYC)


def _parse(argv):
    ap = argparse.ArgumentParser(prog="python -m helpers.distributed",
                                 description="DDP training of ConvBlockNet or CompactNet on CIFAR-10")
    ap.add_argument("--data", help=".pt file with {'train': ImageSet, 'test': ImageSet} state dicts")
    ap.add_argument("--synthetic", type=int, default=0, help="use N synthetic training images instead of --data")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cpu: gloo processes; cuda: one GPU per rank")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--budget-min", type=float, default=0.0,
                    help="train for as many epochs as fit in this many minutes (measured model speed); 0: --epochs")
    ap.add_argument("--batch-size", type=int, default=256, help="per rank; the global batch (MATLAB MiniBatchSize) is this x world size")
    ap.add_argument("--base-lr", type=float, default=0.1, help=f"learning rate for a global batch of {REFERENCE_BATCH}")
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--weight-decay", type=float, default=1e-10, help="MATLAB L2Regularization")
    ap.add_argument("--schedule", choices=["piecewise", "onecycle", "cosine", "constant"], default="piecewise")
    ap.add_argument("--drop-period", type=int, default=50, help="piecewise: epochs between drops (0: at 5/6 of them)")
    ap.add_argument("--drop-factor", type=float, default=0.1, help="piecewise: factor at each drop")
    ap.add_argument("--label-smoothing", type=float, default=0.0)
    ap.add_argument("--model", choices=["convblock", "compact"], default="convblock",
                    help="convblock: MATLAB's network (ConvBlockNet); compact: CompactNet (a fifth of the FLOPs)")
    ap.add_argument("--widths", default="32,64,128")
    ap.add_argument("--depth", type=int, default=4, help="convblock: conv layers per block")
    ap.add_argument("--nesterov", action="store_true", help="Nesterov momentum")
    ap.add_argument("--crop-padding", type=int, default=4, help="random translation of ± this many pixels")
    ap.add_argument("--tta", action="store_true",
                    help="test on each image and its mirror image (the per-epoch validation does not)")
    ap.add_argument("--no-bn", action="store_true", help="no batch norm (DDP then equals one big batch exactly)")
    ap.add_argument("--no-augment", action="store_true")
    ap.add_argument("--no-shuffle", action="store_true")
    ap.add_argument("--train-limit", type=int, default=0, help="train on a fixed random subset of N images (0: all)")
    ap.add_argument("--amp", action="store_true", help="torch.amp autocast (bf16 on CPU/recent GPUs, else fp16)")
    ap.add_argument("--channels-last", action="store_true")
    ap.add_argument("--workers", type=int, default=0, help="DataLoader worker processes per rank (--loader dataloader)")
    ap.add_argument("--loader", choices=["device", "dataloader"], default="device",
                    help="device: images kept on the device, batches augmented there (DeviceLoader); dataloader: "
                         "a DataLoader with per-image transforms on the CPU")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--checkpoint", help="checkpoint file: written by rank 0 each epoch, resumed from if present")
    ap.add_argument("--val-limit", type=int, default=0, help="validate each epoch on a fixed random N test images (0: all)")
    ap.add_argument("--test-limit", type=int, default=0, help="test once on a fixed random N test images (0: all)")
    ap.add_argument("--no-val", action="store_true", help="skip the per-epoch validation and the final test")
    ap.add_argument("--out", help="results JSON (written by rank 0)")
    ap.add_argument("--params-out", help="final parameters as a .pt file (rank 0)")
    ap.add_argument("--estimate-after", type=int, default=10, help="print an epoch-time estimate after N steps")
    ap.add_argument("--fail-at-step", type=int, default=0, help="for tests: raise at this step ...")
    ap.add_argument("--fail-rank", type=int, default=-1, help="... on this rank (first attempt only, not after a restart)")
    return ap.parse_args(argv)


def _load_sets(args):
    if args.synthetic:  # same class patterns, fresh noise for the test images
        return synthetic_images(args.synthetic), synthetic_images(max(args.synthetic // 5, 10), noise_seed=1)
    if not args.data:
        raise SystemExit("error: give --data FILE.pt or --synthetic N")
    state = torch.load(args.data, weights_only=True)
    return ImageSet(**state["train"]), ImageSet(**state["test"])


@dataclass
class Rank:
    """Who this process is in the job, and where it computes (notebook 05)."""

    rank: int
    local_rank: int
    world: int
    device: torch.device
    backend: str
    use_pg: bool  # launched by torchrun (even with one process): a process group exists

    def log(self, *parts) -> None:
        if self.rank == 0:
            print(*parts, flush=True)


def _join(args) -> Rank:
    """Read torchrun's variables, pick this rank's device, and join the process group."""
    import torch.distributed as dist

    rank, local_rank = int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    if args.device == "cuda":
        if torch.cuda.device_count() <= local_rank:
            raise SystemExit(f"error: rank {rank} needs GPU {local_rank} but this node has {torch.cuda.device_count()} "
                             "GPU(s): start at most that many processes per node, or use --device cpu")
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    me = Rank(rank, local_rank, world, device, backend, use_pg="RANK" in os.environ)
    if me.use_pg:
        dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    return me


def _fixed_subset(dataset, limit: int, seed: int):
    """A fixed random subset of ``limit`` items (all of them when ``limit`` is 0 or too large)."""
    from torch.utils.data import Subset

    if not 0 < limit < len(dataset):
        return dataset
    keep = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))[:limit]
    return Subset(dataset, keep.sort().values.tolist())


def _loaders(args, me: Rank, train, test):
    """The rank's training loader (its slice of each epoch), a validation loader on rank 0, the test loader."""
    from torch.utils.data import DataLoader, DistributedSampler

    if args.loader == "device":
        if 0 < args.train_limit < len(train):
            keep = _fixed_subset(range(len(train)), args.train_limit, SUBSET_SEED).indices
            train = ImageSet(train.images[keep], train.labels[keep], train.classes, train.source)
        loader = DeviceLoader(train, args.batch_size, device=me.device, augment=not args.no_augment,
                              shuffle=not args.no_shuffle, seed=args.seed, rank=me.rank, world=me.world,
                              channels_last=args.channels_last, padding=args.crop_padding)
    else:
        train_ds = _fixed_subset(ImageTensorDataset(train, cifar10_transform(train=not args.no_augment)),
                                 args.train_limit, SUBSET_SEED)
        sampler = DistributedSampler(train_ds, num_replicas=me.world, rank=me.rank, shuffle=not args.no_shuffle,
                                     seed=args.seed)
        loader = DataLoader(train_ds, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers,
                            pin_memory=me.device.type == "cuda", persistent_workers=args.workers > 0)
    test_ds = ImageTensorDataset(test, cifar10_transform(train=False))
    pin = me.device.type == "cuda"
    test_loader = DataLoader(_fixed_subset(test_ds, args.test_limit, VAL_SUBSET_SEED), batch_size=EVAL_BATCH,
                             pin_memory=pin)
    val_loader = None
    if me.rank == 0 and not args.no_val:
        val_loader = DataLoader(_fixed_subset(test_ds, args.val_limit, VAL_SUBSET_SEED), batch_size=EVAL_BATCH,
                                pin_memory=pin)
    return loader, val_loader, test_loader


def _throughputs(args, me: Rank, model, loader) -> dict:
    """Rank 0: images/s of the input pipeline alone and of the model alone (a copy, on one fixed batch).

    A GPU measurement is only one if the input side keeps up: below 1.5× the model it is the input that is timed.
    """
    import copy

    if me.rank != 0:
        return {}
    x, y = next(iter(loader))
    twin = copy.deepcopy(model)
    opt = torch.optim.SGD(twin.parameters(), lr=0.01, momentum=args.momentum)
    step = time_train_step(twin, (x, y), me.device, optimizer=opt, amp=args.amp, min_run_time=0.5, warmup=1)
    found = {"input_images_per_s": input_images_per_s(loader, batches=10), "model_images_per_s": step.items_per_s}
    found["input_bound"] = found["input_images_per_s"] < 1.5 * found["model_images_per_s"]
    me.log(f"input pipeline ({args.loader}) {found['input_images_per_s']:.0f} images/s, model alone "
           f"{found['model_images_per_s']:.0f} images/s" + (
               " — WARNING: the input side is slower than 1.5× the model, so this run times the input pipeline, "
               "not the device" if found["input_bound"] else ""))
    return found


def _model(args, me: Rank, train):
    """Identical initial weights on every rank (the same seed and data), channels-last if asked, wrapped in DDP.

    ``--model compact``: CompactNet, its first layer whitening 2×2 patches of the first 5,000 training images.
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(args.seed)
    widths = tuple(int(w) for w in args.widths.split(","))
    if args.model == "compact":
        if args.no_bn:
            raise SystemExit("error: --no-bn is for --model convblock (CompactNet needs its batch norms)")
        model = CompactNet(widths, n_classes=len(train.classes)).init_whitening(normalize(train.images[:5000]))
    else:
        model = ConvBlockNet(widths, args.depth, n_classes=len(train.classes), batch_norm=not args.no_bn)
    model = model.to(me.device)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    net = DDP(model, device_ids=[me.local_rank] if me.device.type == "cuda" else None) if me.use_pg else model
    return model, net


def scaled_lr(args, me: Rank) -> float:
    """The linear scaling rule: ``--base-lr`` for a global batch of 256, scaled with the real global batch.
    (notebook 05)"""
    return args.base_lr * args.batch_size * me.world / REFERENCE_BATCH


def _optimizer(args, me: Rank, net, steps_per_epoch: int):
    """SGD at the linearly scaled learning rate, and its schedule (``helpers.schedules.make_scheduler``)."""
    lr = scaled_lr(args, me)
    trained = [p for p in net.parameters() if p.requires_grad]  # CompactNet's whitening layer is frozen
    groups = [{"params": [p for p in trained if p.ndim > 1], "weight_decay": args.weight_decay},  # weights decay,
              {"params": [p for p in trained if p.ndim <= 1], "weight_decay": 0.0}]  # biases and norms do not
    opt = torch.optim.SGD(groups, lr=lr, momentum=args.momentum, nesterov=args.nesterov)
    sched, step_on = make_scheduler(args.schedule, opt, epochs=args.epochs, steps_per_epoch=steps_per_epoch,
                                    drop_period=args.drop_period or None, drop_factor=args.drop_factor)
    return opt, sched, step_on


def _validation_seconds(args, me: Rank, model, val_loader) -> float:
    """Rank 0, under ``--budget-min``: one timed validation pass (a DataLoader with per-image transforms: on a GPU
    it can cost more than the epoch's steps), so the plan counts it."""
    if val_loader is None or not args.budget_min:  # (only rank 0 has a validation loader)
        return 0.0
    t0 = time.perf_counter()
    evaluate(model, val_loader, me.device, amp=args.amp)
    return time.perf_counter() - t0


def _budget_epochs(args, me: Rank, speeds: dict, train_images: int, val_s: float = 0.0) -> int:
    """``--budget-min``: the epochs planned to fit, from rank 0's measured model, input and validation times; every
    rank gets the same number. Making the batches adds to the steps' time when the loop makes them itself (the
    device loader, or no workers); worker processes make them meanwhile, so then the slower of the two sets the
    pace. The plan sets the schedule's pace only when the loop is faster: fit's time limit stops it on time."""
    if not args.budget_min:
        return args.epochs
    epochs = 0
    if me.rank == 0:
        ips, mine = speeds["model_images_per_s"], train_images / me.world
        steps = mine / ips
        batches = mine / speeds["input_images_per_s"] if speeds["input_images_per_s"] > 0 else 0.0  # 0: one batch
        per_epoch = (steps + batches if args.loader == "device" or args.workers == 0 else max(steps, batches)) + val_s
        epochs = max(1, int(args.budget_min * 60 * BUDGET_SAFETY / per_epoch))
        me.log(f"time budget {args.budget_min:g} min: about {per_epoch:.1f} s per epoch ({val_s:.1f} s of it "
               f"validation) → {epochs} epochs planned; training stops at the budget whatever the plan")
    return int(rank0_value(epochs))


def _step_hook(args, me: Rank, steps_per_epoch: int):
    """The per-step callback: the injected failure (for tests) and rank 0's epoch-time estimate."""
    t_start = time.perf_counter()

    def on_step(info):
        first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        if info["iteration"] == args.fail_at_step and me.rank == args.fail_rank and first_attempt:
            raise RuntimeError(f"injected failure on rank {me.rank} at step {info['iteration']}")
        if info["iteration"] == args.estimate_after and info["epoch"] == 0:
            per_step = (time.perf_counter() - t_start) / args.estimate_after
            me.log(f"estimate: {per_step * steps_per_epoch:.1f} s per epoch, "
                   f"{per_step * steps_per_epoch * args.epochs / 60:.1f} min for {args.epochs} epochs")

    return on_step


def _report(args, me: Rank, model, history, train_images: int, source: str, lr: float, test_loader,
            speeds: dict) -> None:
    """Rank 0: log the epochs, test once, write the results JSON and the final parameters."""
    for e in history.epochs:
        val = f", validation accuracy {e['val_accuracy']:.4f}" if "val_accuracy" in e else ""
        me.log(f"epoch {e['epoch']}: train loss {e['train_loss']:.4f}, train accuracy {e['train_accuracy']:.4f}{val}, "
               f"{e['seconds']:.1f} s, lr {e['lr']:.4g}")
    if me.rank != 0:
        return
    accuracy = plain = None
    if not args.no_val:
        if args.tta:
            test = flip_accuracy(model, test_loader, me.device, amp=args.amp)
            accuracy, plain = test["accuracy"], test["plain"]
        else:
            test = evaluate(model, test_loader, me.device, amp=args.amp)
            accuracy = plain = test["accuracy"]
        me.log(f"test accuracy {accuracy:.4f} on {test['count']} images" +
               (f" (each image and its mirror image; {plain:.4f} on the images alone)" if args.tta else ""))
    record = {"world_size": me.world, "backend": me.backend, "device": me.device.type,
              "global_batch": args.batch_size * me.world, "lr": lr, "planned_epochs": args.epochs,
              "budget_min": args.budget_min or None,
              "train_images": train_images, "source": source,
              "epoch_seconds": [e["seconds"] for e in history.epochs],
              "images_per_s": [train_images / e["seconds"] for e in history.epochs],
              "test_accuracy": accuracy, "test_accuracy_no_tta": plain, "history": history.state_dict(),
              "args": vars(args),
              "autocast": str(resolve_amp(args.amp, me.device)), **_model_flops(history, me.world), **speeds}
    if args.out:
        atomic_write_text(Path(args.out), json.dumps(record, indent=1) + "\n")
    if args.params_out:
        torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, args.params_out)


def _model_flops(history, world: int) -> dict:
    """The model FLOPs fit counted per image, and the FLOP/s of the fastest epoch, all ranks together (fit's rate
    counts the images this rank saw, so an epoch cut short by a time limit counts right; the MFU against a peak is
    ``helpers.ceilings.ddp_mfu``: the notebook knows the device's measured peak)."""
    rates = [e["flops_per_s"] for e in history.epochs if e.get("flops_per_s")]
    if not rates:
        return {}
    return {"flops_per_item": history.final["flops_per_item"], "flops_per_s": max(rates) * world}


def setup(args, me: Rank) -> SimpleNamespace:
    """Data, loaders, the replica, optimizer and schedule of this rank; then its own random stream (notebook 05)."""
    train_set, test_set = _load_sets(args)
    loader, val_loader, test_loader = _loaders(args, me, train_set, test_set)
    model, net = _model(args, me, train_set)
    speeds = _throughputs(args, me, model, loader)
    if me.rank == 0:
        speeds["validation_s"] = _validation_seconds(args, me, model, val_loader)
    args.epochs = _budget_epochs(args, me, speeds, len(loader.dataset), speeds.get("validation_s", 0.0))
    opt, sched, step_on = _optimizer(args, me, net, len(loader))
    # After the identical initial weights, each rank gets its own random stream: per-image transforms on the CPU
    # draw from it (the DeviceLoader seeds its own generator per rank), so ranks never augment alike.
    seed_everything(args.seed + 1 + me.rank)
    return SimpleNamespace(train_set=train_set, loader=loader, val_loader=val_loader, test_loader=test_loader,
                           model=model, net=net, opt=opt, sched=sched, step_on=step_on, speeds=speeds)


def train(args, me: Rank) -> None:
    """Train the network with DDP on this rank: data slice, replica, fit, and rank 0's report (notebook 05)."""
    r = setup(args, me)
    lr = scaled_lr(args, me)  # the peak rate (a OneCycle schedule starts below it)
    how = f"world size {me.world} ({me.backend} on {me.device.type})" if me.use_pg else \
        f"one process on {me.device.type}, no DDP"
    autocast = resolve_amp(args.amp, me.device)
    me.log(f"{how}, {len(r.loader.dataset)} training images from {r.train_set.source}, batch {args.batch_size} per "
           f"rank = {args.batch_size * me.world} global, lr {lr:.4g} ({args.schedule}), {len(r.loader)} steps per epoch, "
           f"autocast {str(autocast).replace('torch.', '') if autocast else 'off'}, float32 without TF32"
           + (" — this CPU has no bf16 instructions, so --amp leaves fp32 on" if args.amp and not autocast else ""))
    r.speeds["time_limit_s"] = 60 * args.budget_min if args.budget_min else None  # fit keeps within it (lesson 05)
    t_fit = time.perf_counter()
    history = fit(r.net, r.loader, epochs=args.epochs, optimizer=r.opt, device=me.device, val_loader=r.val_loader,
                  loss_fn=torch.nn.CrossEntropyLoss(label_smoothing=args.label_smoothing), scheduler=r.sched,
                  scheduler_step=r.step_on, amp=args.amp, checkpoint=args.checkpoint,
                  resume=args.checkpoint is not None, save_checkpoints=me.rank == 0, progress=False,
                  callback=_step_hook(args, me, len(r.loader)),
                  time_limit_s=r.speeds["time_limit_s"])
    r.speeds["train_wall_s"] = time.perf_counter() - t_fit  # steps + validation: what the budget covers
    # epochs trained: a fraction when --budget-min stopped training mid-epoch
    r.speeds["epochs"] = round(history.epochs[-1]["iteration"] / len(r.loader), 3) if history.epochs else 0
    _report(args, me, r.model, history, len(r.loader.dataset), r.train_set.source, lr, r.test_loader, r.speeds)


def main(argv=None) -> int:
    """The torchrun entry point: join the process group, train, leave it (notebook 05)."""
    import torch.distributed as dist

    args = _parse(argv)
    me = _join(args)
    try:
        with float32_precision("ieee"):  # "fp32" means fp32, not TF32 (lesson 08)
            train(args, me)
        if me.use_pg:
            dist.barrier()
    finally:
        if me.use_pg and dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
