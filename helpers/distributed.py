"""Data-parallel training with DDP, and a launcher for it (taught in notebook 05).

Run as a torchrun entry point (each process is one *rank*; torchrun sets RANK, LOCAL_RANK, WORLD_SIZE)::

    torchrun --standalone --nproc_per_node=2 -m helpers.distributed --data cifar.pt --epochs 2 --out run.json

The same command with ``--device cuda`` uses one GPU per rank (backend ``nccl``); with ``--device cpu`` each
rank is a CPU process (backend ``gloo``). Several machines: ``--nnodes=2 --rdzv_backend=c10d
--rdzv_endpoint=HOST:PORT`` on each. From Python (a notebook), ``launch`` starts torchrun as a subprocess.
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .results import atomic_write_text, project_root

# ---------------------------------------------------------------- the entry point (runs inside each rank)


def _parse(argv):
    ap = argparse.ArgumentParser(prog="python -m helpers.distributed", description="DDP training of ConvBlockNet")
    ap.add_argument("--data", help=".pt file with {'train': ImageSet, 'test': ImageSet} state dicts")
    ap.add_argument("--synthetic", type=int, default=0, help="use N synthetic training images instead of --data")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cpu: gloo processes; cuda: one GPU per rank")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=256, help="per rank (MATLAB: MiniBatchSize per GPU)")
    ap.add_argument("--base-lr", type=float, default=0.1, help="learning rate for a global batch of 256")
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--weight-decay", type=float, default=1e-10, help="MATLAB L2Regularization")
    ap.add_argument("--schedule", choices=["piecewise", "onecycle", "cosine", "constant"], default="piecewise")
    ap.add_argument("--drop-period", type=int, default=50, help="piecewise: epochs between drops")
    ap.add_argument("--drop-factor", type=float, default=0.1, help="piecewise: factor at each drop")
    ap.add_argument("--label-smoothing", type=float, default=0.0)
    ap.add_argument("--widths", default="32,64,128")
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--no-bn", action="store_true", help="no batch norm (DDP then equals one big batch exactly)")
    ap.add_argument("--no-augment", action="store_true")
    ap.add_argument("--no-shuffle", action="store_true")
    ap.add_argument("--train-limit", type=int, default=0, help="train on a fixed random subset of N images (0: all)")
    ap.add_argument("--amp", action="store_true", help="torch.amp autocast (bf16 on CPU/recent GPUs, else fp16)")
    ap.add_argument("--channels-last", action="store_true")
    ap.add_argument("--workers", type=int, default=0, help="DataLoader worker processes per rank")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--checkpoint", help="checkpoint file: written by rank 0 each epoch, resumed from if present")
    ap.add_argument("--val-limit", type=int, default=0, help="validate each epoch on a fixed random N test images (0: all)")
    ap.add_argument("--no-val", action="store_true", help="skip the per-epoch validation and the final test")
    ap.add_argument("--out", help="results JSON (written by rank 0)")
    ap.add_argument("--params-out", help="final parameters as a .pt file (rank 0)")
    ap.add_argument("--estimate-after", type=int, default=10, help="print an epoch-time estimate after N steps")
    ap.add_argument("--fail-at-step", type=int, default=0, help="for tests: raise at this step ...")
    ap.add_argument("--fail-rank", type=int, default=-1, help="... on this rank (first attempt only, not after a restart)")
    return ap.parse_args(argv)


def _load_sets(args):
    from .data import ImageSet, synthetic_images

    if args.synthetic:  # same class patterns, fresh noise for the test images
        return synthetic_images(args.synthetic), synthetic_images(max(args.synthetic // 5, 10), noise_seed=1)
    if not args.data:
        raise SystemExit("error: give --data FILE.pt or --synthetic N")
    state = torch.load(args.data, weights_only=True)
    return ImageSet(**state["train"]), ImageSet(**state["test"])


def main(argv=None) -> int:
    """The torchrun entry point: train ConvBlockNet with DDP and write results on rank 0 (notebook 05)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, Subset

    from .data import ImageTensorDataset, cifar10_transform
    from .models import ConvBlockNet
    from .training import evaluate, fit, seed_everything

    args = _parse(argv)
    rank, local_rank = int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))

    def log(*parts):
        if rank == 0:
            print(*parts, flush=True)

    if args.device == "cuda":
        if torch.cuda.device_count() <= local_rank:
            raise SystemExit(f"error: rank {rank} needs GPU {local_rank} but this node has {torch.cuda.device_count()} "
                             "GPU(s): start at most that many processes per node, or use --device cpu")
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    use_pg = "RANK" in os.environ  # launched by torchrun (even with one process)
    if use_pg:
        dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    try:
        seed_everything(args.seed + rank)  # different augmentation draws per rank; weights come from rank 0
        train, test = _load_sets(args)
        train_ds = ImageTensorDataset(train, cifar10_transform(train=not args.no_augment))
        if 0 < args.train_limit < len(train_ds):  # the same subset on every rank and every run
            keep = torch.randperm(len(train_ds), generator=torch.Generator().manual_seed(1234))[:args.train_limit]
            train_ds = Subset(train_ds, keep.sort().values.tolist())
        test_ds = ImageTensorDataset(test, cifar10_transform(train=False))
        sampler = DistributedSampler(train_ds, num_replicas=world, rank=rank, shuffle=not args.no_shuffle,
                                     seed=args.seed)
        pin = device.type == "cuda"
        loader = DataLoader(train_ds, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers,
                            pin_memory=pin, persistent_workers=args.workers > 0)
        test_loader = DataLoader(test_ds, batch_size=512, num_workers=args.workers, pin_memory=pin)
        val_ds = test_ds
        if 0 < args.val_limit < len(test_ds):  # a fixed random subset: every class, as in the full test set
            keep = torch.randperm(len(test_ds), generator=torch.Generator().manual_seed(4321))[:args.val_limit]
            val_ds = Subset(test_ds, keep.sort().values.tolist())
        val_loader = DataLoader(val_ds, batch_size=512, pin_memory=pin) if rank == 0 and not args.no_val else None

        torch.manual_seed(args.seed)  # identical initial weights on every rank
        widths = tuple(int(w) for w in args.widths.split(","))
        model = ConvBlockNet(widths, args.depth, n_classes=len(train.classes), batch_norm=not args.no_bn).to(device)
        if args.channels_last:
            model = model.to(memory_format=torch.channels_last)
        net = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None) if use_pg else model
        global_batch = args.batch_size * world
        lr = args.base_lr * global_batch / 256  # the linear scaling rule
        opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=args.momentum, weight_decay=args.weight_decay)
        step_on = "epoch"
        if args.schedule == "piecewise":
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=args.drop_period, gamma=args.drop_factor)
        elif args.schedule == "cosine":
            sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.epochs)
        elif args.schedule == "onecycle":
            sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=args.epochs * len(loader))
            step_on = "batch"
        else:
            sched = None
        how = f"world size {world} ({backend} on {device.type})" if use_pg else f"one process on {device.type}, no DDP"
        log(f"{how}, {len(train_ds)} training images from {train.source}, "
            f"batch {args.batch_size} per rank = {global_batch} global, lr {lr:.4g} ({args.schedule}), "
            f"{len(loader)} steps per epoch")

        t_start = time.perf_counter()

        def on_step(info):
            first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
            if info["iteration"] == args.fail_at_step and rank == args.fail_rank and first_attempt:
                raise RuntimeError(f"injected failure on rank {rank} at step {info['iteration']}")
            if rank == 0 and info["iteration"] == args.estimate_after and info["epoch"] == 0:
                per_step = (time.perf_counter() - t_start) / args.estimate_after
                log(f"estimate: {per_step * len(loader):.1f} s per epoch, "
                    f"{per_step * len(loader) * args.epochs / 60:.1f} min for {args.epochs} epochs")

        history = fit(net, loader, epochs=args.epochs, optimizer=opt, device=device, val_loader=val_loader,
                      loss_fn=torch.nn.CrossEntropyLoss(label_smoothing=args.label_smoothing),
                      scheduler=sched, scheduler_step=step_on, amp=args.amp, checkpoint=args.checkpoint,
                      resume=args.checkpoint is not None, save_checkpoints=rank == 0, progress=False, callback=on_step)
        for e in history.epochs:
            val = f", validation accuracy {e['val_accuracy']:.4f}" if "val_accuracy" in e else ""
            log(f"epoch {e['epoch']}: train loss {e['train_loss']:.4f}, train accuracy {e['train_accuracy']:.4f}{val}, "
                f"{e['seconds']:.1f} s, lr {e['lr']:.4g}")
        if rank == 0:
            test_metrics = {"accuracy": None}
            if not args.no_val:
                test_metrics = evaluate(model, test_loader, device, amp=args.amp)
                log(f"test accuracy {test_metrics['accuracy']:.4f} on {test_metrics['count']} images")
            record = {"world_size": world, "backend": backend, "device": device.type, "global_batch": global_batch,
                      "lr": lr, "epochs": args.epochs, "train_images": len(train_ds), "source": train.source,
                      "epoch_seconds": [e["seconds"] for e in history.epochs],
                      "images_per_s": [len(train_ds) / e["seconds"] for e in history.epochs],
                      "test_accuracy": test_metrics["accuracy"], "history": history.as_dict(), "args": vars(args)}
            if args.out:
                atomic_write_text(Path(args.out), json.dumps(record, indent=1) + "\n")
            if args.params_out:
                torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, args.params_out)
        if use_pg:
            dist.barrier()
    finally:
        if use_pg and dist.is_initialized():
            dist.destroy_process_group()
    return 0


# ---------------------------------------------------------------- the launcher (runs in the notebook)


@dataclass
class RunResult:
    """What a launch returned: exit code, all output lines, seconds of wall time."""

    returncode: int
    output: list
    seconds: float


def free_port() -> int:
    """An unused TCP port on 127.0.0.1 for the rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_world_size(nproc: int, device: str) -> None:
    """Refuse more GPU workers than GPUs, with the fix in the message (notebook 05)."""
    if nproc < 1:
        raise ValueError(f"nproc must be at least 1, not {nproc}")
    if device.startswith("cuda"):
        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if nproc > have:
            fix = f"use at most {have}, or" if have else "use"
            raise ValueError(f"asked for {nproc} GPU worker(s) but this machine has {have} GPU(s): {fix} "
                             "device='cpu' to run the workers as CPU processes (gloo)")


def _torchrun(nproc: int, args: list, *, nnodes: int = 1, rdzv: str | None = None, max_restarts: int = 0) -> list:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}"]
    if nnodes == 1 and rdzv is None:
        cmd.append("--standalone")
    else:
        cmd += [f"--nnodes={nnodes}", "--rdzv_backend=c10d", f"--rdzv_endpoint={rdzv}", "--rdzv_id=course"]
    if max_restarts:
        cmd.append(f"--max-restarts={max_restarts}")
    return cmd + ["-m", "helpers.distributed", *map(str, args)]


def _run(cmds: list, *, timeout: float, echo: bool, env: dict, prefixes: list) -> RunResult:
    """Run commands together, stream their lines, stop them all on timeout or when one fails."""
    lines: "queue.Queue" = queue.Queue()
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                              start_new_session=True, cwd=project_root()) for c in cmds]

    def pump(proc, prefix):
        for line in proc.stdout:
            lines.put(prefix + line.rstrip("\n"))

    threads = [threading.Thread(target=pump, args=(p, pre), daemon=True) for p, pre in zip(procs, prefixes)]
    for t in threads:
        t.start()
    output, start = [], time.perf_counter()

    def stop_all():
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.perf_counter() + 10
        for p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.perf_counter()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()

    try:
        while True:
            try:
                line = lines.get(timeout=0.2)
                output.append(line)
                if echo:
                    print(line, flush=True)
                continue
            except queue.Empty:
                pass
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes) and not any(t.is_alive() for t in threads):
                break
            if any(c not in (None, 0) for c in codes):
                time.sleep(1.0)  # let the others report, then stop them
                stop_all()
            if time.perf_counter() - start > timeout:
                stop_all()
                tail = "\n".join(output[-30:])
                raise TimeoutError(f"the distributed run took longer than {timeout:.0f} s and was stopped; "
                                   f"last lines:\n{tail}")
    except KeyboardInterrupt:
        stop_all()
        raise
    finally:
        stop_all()
    codes = [p.returncode for p in procs]
    code = next((c for c in codes if c != 0), 0)
    result = RunResult(code, output, time.perf_counter() - start)
    if code != 0:
        first = _first_error(output)
        raise RuntimeError(f"the distributed run failed (exit code {code}). {first}"
                           f"Last lines of the log:\n" + "\n".join(output[-15 if first else -40:]))
    return result


_ERROR_LINE = re.compile(r"^(?:\[(?:node \d+|rank\d+)\][: ]*)*((?:\w+\.)*\w*(?:Error|Exception|Exit)\b:?.*"
                         r"|terminate called.*|\s*what\(\):.*)$")


def _first_error(output: list) -> str:
    """The first exception line a rank printed (the cause; later ones are usually its consequences)."""
    for line in output:
        m = _ERROR_LINE.match(line.strip())
        if m and m.group(1).strip() and "ChildFailedError" not in line:
            return f"First error: {m.group(1).strip()}\n"
    return ""


def _env(nproc_total: int) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(project_root())] + [p for p in [env.get("PYTHONPATH")] if p])
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc_total)))
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def launch(nproc: int, args: list, *, device: str = "cpu", timeout: float = 900, echo: bool = True,
           max_restarts: int = 0, torchrun: bool = True) -> RunResult:
    """Start ``torchrun --nproc_per_node=nproc -m helpers.distributed ARGS`` and stream its output (notebook 05).

    ``torchrun=False`` runs one plain process (``python -m helpers.distributed``, no DDP) as the baseline.
    Raises ``ValueError`` for more GPU workers than GPUs, ``RuntimeError`` with the last lines of the log if a
    rank fails (torchrun then stops the others), ``TimeoutError`` if it runs past ``timeout`` seconds.
    """
    check_world_size(nproc, device)
    dev_type = "cuda" if device.startswith("cuda") else "cpu"
    args = [*map(str, args), "--device", dev_type]
    if not torchrun:
        if nproc != 1:
            raise ValueError("a plain process (torchrun=False) is one process: pass nproc=1")
        cmd = [sys.executable, "-m", "helpers.distributed", *args]
    else:
        cmd = _torchrun(nproc, args, max_restarts=max_restarts)
    return _run([cmd], timeout=timeout, echo=echo, env=_env(nproc), prefixes=[""])


def launch_local_nodes(nnodes: int, nproc_per_node: int, args: list, *, device: str = "cpu", timeout: float = 900,
                       echo: bool = True) -> RunResult:
    """Simulate ``nnodes`` machines on this one: one torchrun per "node", c10d rendezvous on 127.0.0.1 (notebook 05)."""
    check_world_size(nproc_per_node, device)
    dev_type = "cuda" if device.startswith("cuda") else "cpu"
    rdzv = f"127.0.0.1:{free_port()}"
    cmds = [_torchrun(nproc_per_node, [*args, "--device", dev_type], nnodes=nnodes, rdzv=rdzv) for _ in range(nnodes)]
    return _run(cmds, timeout=timeout, echo=echo, env=_env(nnodes * nproc_per_node),
                prefixes=[f"[node {i}] " for i in range(nnodes)])


if __name__ == "__main__":
    sys.exit(main())
