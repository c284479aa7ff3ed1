"""Start and supervise DDP runs from Python (a notebook): ``torchrun`` as a subprocess (taught in notebook 05).

``helpers.distributed`` is what every rank runs; this module is the supervisor around it. It streams the
ranks' output, enforces a time limit, stops every process of a failed run, and raises with the first error
a rank printed (the cause), not torchrun's summary of it.
"""
from __future__ import annotations

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

import torch

from .devices import usable_cpus
from .results import in_checkout, project_root

ENTRY_POINT = "helpers.distributed"  # the module every rank runs (python -m ...)


@dataclass
class RunResult:
    """What a launch returned: exit code, all output lines, seconds of wall time (notebook 05)."""

    returncode: int
    output: list
    seconds: float


def free_port() -> int:
    """An unused TCP port on 127.0.0.1 for the rendezvous (notebook 05)."""
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


def _torchrun(nproc: int, args: list, *, nnodes: int = 1, rdzv: str | None = None, module: str = ENTRY_POINT) -> list:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}"]
    if nnodes == 1 and rdzv is None:
        cmd.append("--standalone")
    else:
        cmd += [f"--nnodes={nnodes}", "--rdzv_backend=c10d", f"--rdzv_endpoint={rdzv}", "--rdzv_id=course"]
    return cmd + ["-m", module, *map(str, args)]


class _Supervisor:
    """Runs commands side by side in their own process groups, collecting their output lines in one queue."""

    def __init__(self, cmds: list, envs: list, prefixes: list):
        self.lines: "queue.Queue" = queue.Queue()
        self.procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                       start_new_session=True, cwd=project_root() if in_checkout() else None)
                      for c, env in zip(cmds, envs)]
        self.threads = [threading.Thread(target=self._pump, args=(p, pre), daemon=True)
                        for p, pre in zip(self.procs, prefixes)]
        for t in self.threads:
            t.start()

    def _pump(self, proc, prefix: str) -> None:
        for line in proc.stdout:
            self.lines.put(prefix + line.rstrip("\n"))

    def finished(self) -> bool:
        return all(p.poll() is not None for p in self.procs) and not any(t.is_alive() for t in self.threads)

    def failed(self) -> bool:
        return any(p.poll() not in (None, 0) for p in self.procs)

    def stop_all(self) -> None:
        """SIGTERM every process group still running; SIGKILL what has not ended 10 s later."""
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.perf_counter() + 10
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.perf_counter()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()

    def exit_code(self) -> int:
        return next((p.returncode for p in self.procs if p.returncode != 0), 0)


def _run(cmds: list, *, timeout: float, echo: bool, envs: list, prefixes: list) -> RunResult:
    """Run commands together (each with its environment), stream their lines, stop all on timeout or a failure."""
    sup, output, start = _Supervisor(cmds, envs, prefixes), [], time.perf_counter()
    try:
        while True:
            try:
                line = sup.lines.get(timeout=0.2)
                output.append(line)
                if echo:
                    print(line, flush=True)
                continue
            except queue.Empty:
                pass
            if sup.finished():
                break
            if sup.failed():
                time.sleep(1.0)  # let the others report, then stop them
                sup.stop_all()
            if time.perf_counter() - start > timeout:
                sup.stop_all()
                raise TimeoutError(f"the distributed run took longer than {timeout:.0f} s and was stopped; "
                                   "last lines:\n" + "\n".join(output[-30:]))
    finally:
        sup.stop_all()  # also on KeyboardInterrupt: no rank outlives the notebook cell
    code = sup.exit_code()
    if code != 0:
        first = _first_error(output)
        raise RuntimeError(f"the distributed run failed (exit code {code}). {first}"
                           f"Last lines of the log:\n" + "\n".join(output[-15 if first else -40:]))
    return RunResult(code, output, time.perf_counter() - start)


_ERROR_LINE = re.compile(r"^(?:\[(?:node \d+|rank\d+)\][: ]*)*((?:\w+\.)*\w*(?:Error|Exception|Exit)\b:?.*"
                         r"|terminate called.*|\s*what\(\):.*)$")


def _first_error(output: list) -> str:
    """The first exception line a rank printed (the cause; later ones are usually its consequences)."""
    for line in output:
        m = _ERROR_LINE.match(line.strip())
        if m and m.group(1).strip() and "ChildFailedError" not in line:
            return f"First error: {m.group(1).strip()}\n"
    return ""


def _env(nproc_total: int, visible_gpus: list | None = None) -> dict:
    """The ranks' environment: the project importable, CPU threads shared out, and (per node) which GPUs it sees."""
    env = dict(os.environ)
    if in_checkout():  # (an installed course is importable already)
        env["PYTHONPATH"] = os.pathsep.join([str(project_root())] + [p for p in [env.get("PYTHONPATH")] if p])
    env.setdefault("OMP_NUM_THREADS", str(max(1, usable_cpus() // nproc_total)))
    env.setdefault("PYTHONUNBUFFERED", "1")
    if visible_gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(visible_gpus)
    return env


def gpu_slices(nnodes: int, nproc_per_node: int) -> list:
    """Give each simulated node its own GPUs: ``nproc_per_node`` of the visible ones each, never shared (notebook 05).

    Two "nodes" on one GPU would put two NCCL ranks on one device, which NCCL refuses. Respects an existing
    ``CUDA_VISIBLE_DEVICES``; raises ``ValueError`` when there are not enough GPUs for all the processes.
    """
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    visible = [g.strip() for g in given.split(",") if g.strip()] if given else \
        [str(i) for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0)]
    need = nnodes * nproc_per_node
    if need > len(visible):
        raise ValueError(f"{nnodes} nodes × {nproc_per_node} GPU processes need {need} GPUs but this machine has "
                         f"{len(visible)}: use fewer, or device='cpu' to run the workers as CPU processes (gloo)")
    return [visible[i * nproc_per_node:(i + 1) * nproc_per_node] for i in range(nnodes)]


def launch(nproc: int, args: list, *, device: str = "cpu", timeout: float = 900, echo: bool = True,
           torchrun: bool = True, module: str = ENTRY_POINT) -> RunResult:
    """Start ``torchrun --nproc_per_node=nproc -m helpers.distributed ARGS`` and stream its output (notebook 05).

    ``torchrun=False`` runs one plain process (``python -m helpers.distributed``, no DDP) as the baseline;
    ``module`` names another per-rank program (``helpers.sharding``, notebook 09).
    Raises ``ValueError`` for more GPU workers than GPUs, ``RuntimeError`` with the last lines of the log if a
    rank fails (torchrun then stops the others), ``TimeoutError`` if it runs past ``timeout`` seconds.
    """
    check_world_size(nproc, device)
    dev_type = "cuda" if device.startswith("cuda") else "cpu"
    args = [*map(str, args), "--device", dev_type]
    if not torchrun:
        if nproc != 1:
            raise ValueError("a plain process (torchrun=False) is one process: pass nproc=1")
        cmd = [sys.executable, "-m", module, *args]
    else:
        cmd = _torchrun(nproc, args, module=module)
    return _run([cmd], timeout=timeout, echo=echo, envs=[_env(nproc)], prefixes=[""])


def launch_local_nodes(nnodes: int, nproc_per_node: int, args: list, *, device: str = "cpu", timeout: float = 900,
                       echo: bool = True) -> RunResult:
    """Simulate ``nnodes`` machines on this one: one torchrun per "node", c10d rendezvous on 127.0.0.1 (notebook 05).

    With ``device="cuda"`` each node sees its own GPUs (``CUDA_VISIBLE_DEVICES``), as on separate machines.
    """
    check_world_size(nproc_per_node, device)
    dev_type = "cuda" if device.startswith("cuda") else "cpu"
    slices = gpu_slices(nnodes, nproc_per_node) if dev_type == "cuda" else [None] * nnodes
    rdzv = f"127.0.0.1:{free_port()}"
    cmds = [_torchrun(nproc_per_node, [*args, "--device", dev_type], nnodes=nnodes, rdzv=rdzv) for _ in range(nnodes)]
    envs = [_env(nnodes * nproc_per_node, gpus) for gpus in slices]
    return _run(cmds, timeout=timeout, echo=echo, envs=envs, prefixes=[f"[node {i}] " for i in range(nnodes)])
