"""Pick a device and describe the hardware (taught in notebook 00).

Nothing here probes hardware at import time: every function looks when it is called.
"""
from __future__ import annotations

import contextlib
import os
import platform
import re
import shutil
import subprocess

import torch

DEVICE_CHOICES = ("auto", "cpu", "cuda", "cuda:N", "mps")


def usable_cpus() -> int:
    """CPU cores this process may run on (its affinity mask: a batch job's share, not the whole node's count).
    (notebook 04)"""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # macOS and Windows have no affinity mask
        return os.cpu_count() or 1


def loader_workers(cap: int = 8) -> int:
    """DataLoader worker processes to use: the usable cores minus one for the main process, at most ``cap``.

    Never ``os.cpu_count()`` raw: GPU nodes report 100+ cores, and each worker costs memory (and shared memory,
    which containers keep small). Notebook 04 measures what workers buy. ``$COURSE_LOADER_WORKERS`` caps it
    (``make gpu-check`` sets 0 where ``/dev/shm`` is too small for workers to hand batches over).
    """
    env = os.environ.get("COURSE_LOADER_WORKERS", "")
    cap = min(cap, int(env)) if env.isdigit() else cap
    return max(0, min(cap, usable_cpus() - 1))


def _cpuinfo(key: str) -> str | None:
    """The first value of ``key`` in Linux's /proc/cpuinfo; None elsewhere."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            return next((line.split(":", 1)[1].strip() for line in fh if line.lower().startswith(key)), None)
    except OSError:
        return None


def cpu_flags() -> set:
    """The CPU's feature flags (Linux ``/proc/cpuinfo``; empty elsewhere) (notebook 06)."""
    return set((_cpuinfo("flags") or "").split())


def cpu_bf16_native() -> bool:
    """True when the CPU has bf16 instructions (AVX-512 BF16 or AMX); without them bf16 is emulated and slower than
    fp32 (notebooks 05, 06). On Apple silicon and other non-Linux systems: unknown, so False."""
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


def compute_capability(device) -> tuple[int, int] | None:
    """``(major, minor)`` of a CUDA ``device`` (7.5: T4; 8.0: A100; 9.0: H100, H200), None elsewhere (notebook 06)."""
    device = torch.device(device)
    return tuple(torch.cuda.get_device_capability(device)) if device.type == "cuda" else None


def apple_gpu_gib() -> float:
    """Metal's recommended working set of this Mac's GPU in GiB (``torch.mps.recommended_max_memory``), 0 without
    one: the unified memory a run may use without slowing the machine (notebook 00)."""
    return torch.mps.recommended_max_memory() / 2**30 if _mps_available() else 0.0


def half_precision(device) -> torch.dtype | None:
    """The one rule for a device's half precision, used by every lesson (notebook 06): bf16 where it is native —
    CUDA compute capability >= 8.0 (Ampere and newer), a CPU with bf16 instructions — else fp16 on a CUDA GPU
    (T4, V100: with ``GradScaler``) and on an Apple GPU; None on a CPU without bf16 instructions, where emulated
    bf16 is slower than fp32. ``torch.cuda.is_bf16_supported()`` says True for GPUs that only emulate bf16."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.bfloat16 if compute_capability(device) >= (8, 0) else torch.float16
    if device.type == "mps":
        return torch.float16
    return torch.bfloat16 if cpu_bf16_native() else None


def has_tf32(device) -> bool:
    """True where TF32 exists: CUDA GPUs of compute capability >= 8.0 (notebooks 02, 06, 08)."""
    capability = compute_capability(device)
    return capability is not None and capability >= (8, 0)


def precisions(device) -> dict:
    """The rows a lesson compares on ``device``: ``{"fp32": (torch.float32, False), "tf32": (torch.float32, True)
    where TF32 exists, "bf16" or "fp16": (dtype, False) by ``half_precision``}`` (notebooks 02, 06, 08)."""
    rows = {"fp32": (torch.float32, False)}
    if has_tf32(device):
        rows["tf32"] = (torch.float32, True)
    half = half_precision(device)
    if half is not None:
        rows["bf16" if half is torch.bfloat16 else "fp16"] = (half, False)
    return rows


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def available_devices() -> list[str]:
    """List the device strings usable on this machine, e.g. ``["cpu", "cuda:0"]`` (notebook 00)."""
    found = ["cpu"]
    if torch.cuda.is_available():
        found += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if _mps_available():
        found.append("mps")
    return found


def pick_device(name: str | torch.device = "auto") -> torch.device:
    """Turn ``"auto" | "cpu" | "cuda" | "cuda:N" | "mps"`` into a ``torch.device`` (notebook 00).

    ``"auto"`` prefers CUDA, then Apple's MPS, then the CPU. An unknown name, or a device this
    machine lacks, raises ``ValueError`` naming what is available.
    """
    if isinstance(name, torch.device):
        name = str(name)
    if not isinstance(name, str):
        raise ValueError(f"device must be a string such as 'auto' or 'cpu', not {type(name).__name__}")
    key = name.strip().lower()
    here = ", ".join(available_devices())
    if key == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", 0)
        if _mps_available():
            return torch.device("mps")
        return torch.device("cpu")
    if key == "cpu":
        return torch.device("cpu")
    match = re.fullmatch(r"cuda(?::(\d+))?", key)
    if match:
        if not torch.cuda.is_available():
            raise ValueError(
                f"device {name!r} was asked for but CUDA is not available on this machine "
                f"(no NVIDIA GPU or driver found); available here: {here}. Use device='auto' or 'cpu'."
            )
        index = int(match.group(1) or 0)
        count = torch.cuda.device_count()
        if index >= count:
            raise ValueError(
                f"device {name!r} does not exist: this machine has {count} CUDA device(s); available here: {here}"
            )
        return torch.device("cuda", index)
    if key == "mps":
        if not _mps_available():
            raise ValueError(
                f"device 'mps' was asked for but Apple's Metal backend is not available here; available here: {here}"
            )
        return torch.device("mps")
    raise ValueError(f"unknown device {name!r}: use one of {', '.join(DEVICE_CHOICES)}; available here: {here}")


def make_current(device: str | torch.device) -> torch.device:
    """Make a CUDA ``device`` the *current* one (``torch.cuda.set_device``) and return it (notebook 00).

    CUDA events, ``torch.cuda.synchronize()`` without an argument, ``torch.utils.benchmark`` and new tensors on
    ``"cuda"`` all use the current device, cuda:0 unless told otherwise: with ``cuda:1`` chosen, they would
    measure or wait on the wrong GPU. A no-op for the CPU and MPS.
    """
    device = torch.device(device)
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)
    return device


def _precision_flags() -> list:
    """``(label, module, attribute)`` for each flag that sets fp32 precision on this torch: matmul, cuDNN conv and
    cuDNN RNN (torch >= 2.9), or the two ``allow_tf32`` flags of older torch (cuBLAS, and one for all of cuDNN)."""
    b = torch.backends
    if hasattr(b.cuda.matmul, "fp32_precision") and hasattr(b.cudnn, "conv"):  # torch >= 2.9
        flags = [("matmul", b.cuda.matmul, "fp32_precision"), ("cuDNN conv", b.cudnn.conv, "fp32_precision")]
        if hasattr(getattr(b.cudnn, "rnn", None), "fp32_precision"):
            flags.append(("cuDNN RNN", b.cudnn.rnn, "fp32_precision"))
        return flags
    return [("matmul allow_tf32", b.cuda.matmul, "allow_tf32"), ("cuDNN allow_tf32", b.cudnn, "allow_tf32")]


@contextlib.contextmanager
def float32_precision(mode: str):
    """Within the block, fp32 matmuls, cuDNN convolutions *and* cuDNN RNNs run as ``"ieee"`` fp32 or as ``"tf32"``
    (taught in notebook 08; every fp32 timing from notebook 02 on runs inside it).

    On Ampere and newer GPUs cuDNN convolutions and RNNs default to TF32 while matmuls default to fp32, so an
    "fp32" timing of a conv net or an LSTM is really TF32 unless someone says otherwise. Measurements that compare
    precisions set it explicitly with this and label TF32 as its own row. The block sets the two ``allow_tf32``
    flags (cuBLAS, and one for all of cuDNN), which on torch >= 2.9 also set each backend's ``fp32_precision``
    consistently: writing the new per-operator flags instead leaves a state in which reading a legacy flag
    (``torch.backends.cuda.matmul.allow_tf32``, ``torch.get_float32_matmul_precision()``, as ``torch.compile``,
    inductor and the profiler do) raises "mix of the legacy and new APIs" (pytorch#166387). No effect on CPUs;
    the previous settings come back after.
    """
    if mode not in ("ieee", "tf32"):
        raise ValueError(f"mode must be 'ieee' (true fp32) or 'tf32', not {mode!r}")
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    groups = [(matmul, [matmul]), (cudnn, [getattr(cudnn, op, None) for op in ("conv", "rnn")])]
    saved = [_saved_flags(legacy, new) for legacy, new in groups]
    matmul.allow_tf32 = cudnn.allow_tf32 = mode == "tf32"
    try:
        yield mode
    finally:
        for restore in saved:
            restore()


def _saved_flags(legacy, new: list):
    """A function that restores one group's TF32 settings (cuBLAS, or all of cuDNN) as they are now: through its
    legacy ``allow_tf32`` flag where that reads (a state both APIs read), else through the new per-operator flags
    the learner set by hand (``float32_precision``)."""
    try:
        value = legacy.allow_tf32
    except RuntimeError:  # a mix the learner made: given back exactly
        flags = [(obj, obj.fp32_precision) for obj in new if hasattr(obj, "fp32_precision")]
        return lambda: [setattr(obj, "fp32_precision", v) for obj, v in flags]
    return lambda: setattr(legacy, "allow_tf32", value)


def float32_settings() -> dict:
    """The fp32 precision in force per operation, read without assuming a torch version (notebook 08).

    torch >= 2.9: ``{"matmul": ..., "cuDNN conv": ..., "cuDNN RNN": ...}``, the ``fp32_precision`` values
    (``"none"``: the parent's setting, by default true fp32; ``float32_precision("ieee")`` leaves cuDNN's at
    "none"); older torch: the two ``allow_tf32`` flags (True: TF32 allowed).
    """
    return {label: getattr(obj, attr) for label, obj, attr in _precision_flags()}


def synchronize(device: str | torch.device) -> None:
    """Wait until all queued work on ``device`` has finished; a no-op on the CPU (notebook 00)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def _cpu_model() -> str:
    if name := _cpuinfo("model name"):
        return name
    if platform.system() == "Darwin":
        try:
            out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                                 timeout=5)
            if out.stdout.strip():
                return out.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine() or "unknown CPU"


def nvidia_smi(fields: list[str]) -> list[dict] | None:
    """One row per GPU of ``nvidia-smi --query-gpu=FIELDS`` as ``{field: text}``, or None without nvidia-smi.

    The one place the course asks ``nvidia-smi`` anything (driver version here, PCIe link in notebook 03).
    """
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    rows = [[v.strip() for v in line.split(",")] for line in out.stdout.strip().splitlines() if line.strip()]
    return [dict(zip(fields, row)) for row in rows if len(row) == len(fields)] or None


def nvidia_driver() -> str | None:
    """The NVIDIA driver's version from ``nvidia-smi``, None without one (notebook 00; ``make check``)."""
    rows = nvidia_smi(["driver_version"])
    return rows[0]["driver_version"] if rows else None


def describe() -> dict:
    """Describe this machine as plain data: CPU, threads, GPUs, torch/CUDA versions (notebook 00)."""
    gpus = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            gpus.append({
                "index": i,
                "name": p.name,
                "memory_gib": round(p.total_memory / 2**30, 1),
                "compute_capability": f"{p.major}.{p.minor}",
                "multiprocessors": p.multi_processor_count,
            })
    cudnn = torch.backends.cudnn.version() if torch.cuda.is_available() else None
    return {
        "cpu": _cpu_model(),
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "platform": f"{platform.system()} {platform.release()} ({platform.machine()})",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_build": torch.version.cuda,
        "cudnn": cudnn,
        "nvidia_driver": nvidia_driver() if gpus else None,
        "gpus": gpus,
        "mps": _mps_available(),
        "name": hardware_name(gpus=gpus),
    }


def _slug(text: str) -> str:
    text = re.sub(r"\((r|tm)\)|cpu @.*|\d+-core processor", "", text.lower())
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-")


def hardware_name(gpus: list[dict] | None = None) -> str:
    """A short folder-safe name for this machine, e.g. ``1x-nvidia-h200`` or ``cpu-amd-epyc-9654-2t`` (notebook 00)."""
    if gpus is None:
        gpus = [{"name": torch.cuda.get_device_name(i)} for i in range(torch.cuda.device_count())] \
            if torch.cuda.is_available() else []
    if gpus:
        return f"{len(gpus)}x-{_slug(gpus[0]['name'])}"
    prefix = "apple-mps" if _mps_available() else "cpu"
    return f"{prefix}-{_slug(_cpu_model())}-{os.cpu_count()}t"


def describe_markdown(desc: dict) -> str:
    """Render ``describe()`` as a Markdown table for a notebook's "Your hardware" cell (notebook 00)."""
    rows = [
        ("CPU", f"{desc['cpu']} ({desc['cpu_cores']} logical cores, torch uses {desc['torch_threads']} threads)"),
        ("Platform", f"{desc['platform']}, Python {desc['python']}"),
        ("PyTorch", f"{desc['torch']} (CUDA build: {desc['cuda_build'] or 'none'})"),
    ]
    if desc["gpus"]:
        for g in desc["gpus"]:
            rows.append((f"GPU {g['index']}", f"{g['name']}, {g['memory_gib']} GiB, compute capability "
                                              f"{g['compute_capability']}"))
        rows.append(("NVIDIA driver", desc["nvidia_driver"] or "unknown"))
    else:
        rows.append(("GPU", "none found (CUDA not available)"))
    rows.append(("Apple MPS", "available" if desc["mps"] else "not available"))
    rows.append(("Results folder name", f"`{desc['name']}`"))
    return "| | |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows)
