"""Unit tests of helpers.devices (this machine has no GPU; CUDA/MPS paths are faked where needed)."""
import json

import pytest
import torch

from helpers import devices


def test_auto_and_cpu_pick_a_real_device():
    assert devices.pick_device("cpu") == torch.device("cpu")
    assert devices.pick_device(" CPU ") == torch.device("cpu")
    assert devices.pick_device("auto").type in {"cpu", "cuda", "mps"}
    assert devices.pick_device(torch.device("cpu")) == torch.device("cpu")


@pytest.mark.parametrize("name", ["gpu", "cuda:x", "tpu", "", "cuda0"])
def test_unknown_device_names_what_is_available(name):
    with pytest.raises(ValueError, match=r"unknown device .*available here: cpu"):
        devices.pick_device(name)


def test_non_string_device_is_rejected():
    with pytest.raises(ValueError, match="must be a string"):
        devices.pick_device(0)


def test_cuda_requested_without_cuda_is_a_one_line_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError) as err:
        devices.pick_device("cuda")
    msg = str(err.value)
    assert "CUDA is not available" in msg and "device='auto' or 'cpu'" in msg and "\n" not in msg


def test_cuda_index_beyond_count(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert devices.pick_device("cuda:1") == torch.device("cuda", 1)
    assert devices.pick_device("auto") == torch.device("cuda", 0)
    with pytest.raises(ValueError, match="has 2 CUDA device"):
        devices.pick_device("cuda:2")


def test_mps_requested_without_mps(monkeypatch):
    monkeypatch.setattr(devices, "_mps_available", lambda: False)
    with pytest.raises(ValueError, match="'mps' was asked for"):
        devices.pick_device("mps")


def test_auto_prefers_mps_over_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(devices, "_mps_available", lambda: True)
    assert devices.pick_device("auto") == torch.device("mps")
    assert devices.available_devices() == ["cpu", "mps"]


def test_describe_is_plain_json_data():
    desc = devices.describe()
    assert json.loads(json.dumps(desc)) == desc
    for key in ("cpu", "cpu_cores", "torch_threads", "torch", "gpus", "mps", "name"):
        assert key in desc
    assert desc["torch"] == torch.__version__
    assert desc["name"] == devices.hardware_name()
    table = devices.describe_markdown(desc)
    assert table.startswith("| | |") and desc["cpu"] in table


def test_hardware_name_is_folder_safe():
    assert devices.hardware_name([{"name": "NVIDIA H200"}, {"name": "NVIDIA H200"}]) == "2x-nvidia-h200"
    name = devices.hardware_name([])
    assert name.startswith(("cpu-", "apple-mps-")) and "/" not in name and " " not in name


def test_importing_helpers_probes_no_hardware(monkeypatch):
    import importlib
    import sys

    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: calls.append("probe") or False)
    for mod in [m for m in sys.modules if m == "helpers" or m.startswith("helpers.")]:
        monkeypatch.delitem(sys.modules, mod)
    importlib.import_module("helpers")
    for name in ("devices", "timing", "results", "training", "plots"):
        importlib.import_module(f"helpers.{name}")
    assert calls == []


def _fake_nvidia_smi(tmp_path, monkeypatch, stdout: str, code: int = 0):
    exe = tmp_path / "nvidia-smi"
    exe.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path / 'args'}\nprintf '{stdout}'\nexit {code}\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")


def test_nvidia_smi_parses_one_row_per_gpu(tmp_path, monkeypatch):
    _fake_nvidia_smi(tmp_path, monkeypatch, "4, 16\\n5, 8\\n")
    rows = devices.nvidia_smi(["pcie.link.gen.max", "pcie.link.width.max"])
    assert rows == [{"pcie.link.gen.max": "4", "pcie.link.width.max": "16"},
                    {"pcie.link.gen.max": "5", "pcie.link.width.max": "8"}]
    args = (tmp_path / "args").read_text()
    assert "--query-gpu=pcie.link.gen.max,pcie.link.width.max" in args and "noheader" in args


def test_nvidia_smi_failing_or_missing_gives_none(tmp_path, monkeypatch):
    _fake_nvidia_smi(tmp_path, monkeypatch, "NVIDIA-SMI has failed\\n", code=9)
    assert devices.nvidia_smi(["driver_version"]) is None
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert devices.nvidia_smi(["driver_version"]) is None


def test_pcie_link_is_the_max_link_of_the_gpu_in_use(tmp_path, monkeypatch):
    """The GPU in use (matched by UUID, else by CUDA_VISIBLE_DEVICES), its max link (an idle link reads Gen1)."""
    from helpers import transfer

    rows = "0, GPU-aaaa, NVIDIA H100, 5, 16\\n1, GPU-bbbb, NVIDIA A100, 4, 8\\n"
    _fake_nvidia_smi(tmp_path, monkeypatch, rows)
    monkeypatch.setattr(transfer, "_cuda_uuid", lambda d: "bbbb")
    link = transfer.pcie_link("cuda:0")
    assert (link["kind"], link["name"], link["generation"], link["width"]) == ("pcie", "NVIDIA A100", 4, 8)
    assert "pcie.link.gen.max" in (tmp_path / "args").read_text()
    monkeypatch.setattr(transfer, "_cuda_uuid", lambda d: None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert transfer.pcie_link("cuda:0")["name"] == "NVIDIA A100"  # cuda:0 of this process is GPU 1 of the node
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    link = transfer.pcie_link("cuda:0")
    assert link["gbps"] == pytest.approx(63.0, rel=0.01) and link["generation"] == 5


def test_superchip_host_link_is_not_pcie(tmp_path, monkeypatch):
    from helpers import transfer

    _fake_nvidia_smi(tmp_path, monkeypatch, "0, GPU-cccc, NVIDIA GH200 480GB, 5, 16\\n")
    monkeypatch.setattr(transfer, "_cuda_uuid", lambda d: "cccc")
    link = transfer.pcie_link("cuda:0")
    assert link["kind"] == "nvlink-c2c" and link["gbps"] is None


def test_workers_follow_the_affinity_mask_not_the_node(monkeypatch):
    import os

    monkeypatch.setattr(os, "cpu_count", lambda: 192)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(4)), raising=False)
    assert devices.usable_cpus() == 4 and devices.loader_workers() == 3
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    assert devices.loader_workers() == 8 and devices.loader_workers(cap=2) == 2


def _tf32_in_force() -> dict:
    """Whether TF32 is allowed, per operation, as torch itself reads it (new flags: "none" inherits true fp32)."""
    return {label: value == "tf32" for label, value in devices.float32_settings().items()}


def _legacy_reads() -> tuple:
    """The reads torch.compile, inductor and the profiler make: they raise after a mix of legacy and new flags."""
    return (torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision(),
            torch.backends.cudnn.allow_tf32)


def test_float32_precision_sets_matmul_conv_and_rnn_and_restores():
    """cuDNN convolutions and RNNs default to TF32 (lesson 06's "fp32" conv and LSTM rows would be TF32 without
    this), matmuls to fp32."""
    before, legacy = _tf32_in_force(), _legacy_reads()
    assert before == {"matmul": False, "cuDNN conv": True, "cuDNN RNN": True}, "the defaults the lesson teaches"
    with devices.float32_precision("ieee"):
        assert _tf32_in_force() == {"matmul": False, "cuDNN conv": False, "cuDNN RNN": False}
    assert _tf32_in_force() == before and _legacy_reads() == legacy
    with devices.float32_precision("tf32"):
        assert _tf32_in_force() == {"matmul": True, "cuDNN conv": True, "cuDNN RNN": True}
    assert _tf32_in_force() == before and _legacy_reads() == legacy
    with pytest.raises(RuntimeError):
        with devices.float32_precision("ieee"):
            raise RuntimeError("an error inside the block")
    assert _tf32_in_force() == before, "restored when the block raises, too"
    with pytest.raises(ValueError, match="'ieee'"):
        with devices.float32_precision("fp32"):
            pass


@pytest.mark.parametrize("mode", ["ieee", "tf32"])
def test_the_legacy_flags_stay_readable_inside_and_after_the_block(mode):
    """pytorch#166387: after a write through the new per-operator flags, reading a legacy flag raises "mix of the
    legacy and new APIs". A learner who compiles or profiles inside the block (or after it) reads them."""
    with devices.float32_precision(mode):
        matmul_tf32, precision, cudnn_tf32 = _legacy_reads()
        assert matmul_tf32 is (mode == "tf32") and cudnn_tf32 is (mode == "tf32")
        assert precision == ("high" if mode == "tf32" else "highest")
    _legacy_reads()
    torch.backends.cuda.matmul.fp32_precision = "tf32"  # what the block used to write: the reads raise
    try:
        with pytest.raises(RuntimeError, match="mix of the legacy and new"):
            torch.backends.cuda.matmul.allow_tf32
        with devices.float32_precision(mode):  # a learner's own new-API state is given back exactly
            _legacy_reads()
        assert torch.backends.cuda.matmul.fp32_precision == "tf32"
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False


def test_float32_precision_on_torch_before_2_9(monkeypatch):
    """Without the fp32_precision API: the two allow_tf32 flags (cuBLAS, and all of cuDNN) are set and restored."""
    import types

    matmul = types.SimpleNamespace(allow_tf32=True)
    monkeypatch.setattr(torch.backends.cuda, "matmul", matmul)
    assert [(obj, attr) for _, obj, attr in devices._precision_flags()] == [(matmul, "allow_tf32"),
                                                                            (torch.backends.cudnn, "allow_tf32")]
    assert set(devices.float32_settings()) == {"matmul allow_tf32", "cuDNN allow_tf32"}
    with devices.float32_precision("ieee"):
        assert matmul.allow_tf32 is False and torch.backends.cudnn.allow_tf32 is False
    assert matmul.allow_tf32 is True


@pytest.mark.parametrize("capability,half,tf32", [((7, 0), "fp16", False), ((7, 5), "fp16", False),
                                                  ((8, 0), "bf16", True), ((9, 0), "bf16", True)])
def test_one_half_precision_rule_on_each_gpu_generation(monkeypatch, capability, half, tf32):
    """A T4 (7.5) or V100 (7.0) gets fp16 (with a GradScaler) and no TF32 row; Ampere and newer bf16 and TF32."""
    monkeypatch.setattr(devices, "compute_capability", lambda device: capability)
    gpu = torch.device("cuda", 0)
    assert devices.half_precision(gpu) is {"fp16": torch.float16, "bf16": torch.bfloat16}[half]
    assert devices.has_tf32(gpu) is tf32
    assert list(devices.precisions(gpu)) == ["fp32"] + (["tf32"] if tf32 else []) + [half]


def test_half_precision_on_a_cpu_follows_its_bf16_instructions(monkeypatch):
    for native, rows in [(True, ["fp32", "bf16"]), (False, ["fp32"])]:
        monkeypatch.setattr(devices, "cpu_bf16_native", lambda native=native: native)
        assert list(devices.precisions("cpu")) == rows
    assert devices.half_precision("mps") is torch.float16 and not devices.has_tf32("mps")
