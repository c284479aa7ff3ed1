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


def test_float32_precision_sets_matmul_and_conv_and_restores():
    before = (torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision)
    assert before[1] == "tf32", "cuDNN convolutions default to TF32: the reason 'fp32' must be set explicitly"
    with devices.float32_precision("ieee"):
        assert (torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision) == ("ieee",
                                                                                                       "ieee")
    assert (torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision) == before
    with pytest.raises(ValueError, match="'ieee'"):
        with devices.float32_precision("fp32"):
            pass


def test_bf16_autocast_needs_native_bf16_on_cuda(monkeypatch):
    from helpers import training

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    assert training.resolve_amp(True, torch.device("cuda")) is torch.float16, "emulated bf16 (V100, T4): use fp16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert training.resolve_amp("auto", torch.device("cuda")) is torch.bfloat16

    def old_torch():  # no including_emulation argument
        return True

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", old_torch)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (7, 0))
    assert training.cuda_bf16_native() is False


def test_float32_precision_sets_the_cudnn_rnn_flag_too_and_restores():
    """cuDNN RNNs default to TF32 as convolutions do (lesson 06's "fp32" LSTM rows would be TF32 without this)."""
    rnn = torch.backends.cudnn.rnn
    before = rnn.fp32_precision
    assert before == "tf32", "cuDNN RNNs default to TF32: the reason 'fp32' must set the RNN flag as well"
    with devices.float32_precision("ieee"):
        assert rnn.fp32_precision == "ieee"
        assert devices.float32_settings() == {"matmul": "ieee", "cuDNN conv": "ieee", "cuDNN RNN": "ieee"}
    assert rnn.fp32_precision == before
    with pytest.raises(RuntimeError):
        with devices.float32_precision("ieee"):
            raise RuntimeError("an error inside the block")
    assert rnn.fp32_precision == before, "restored when the block raises, too"


def test_float32_precision_without_the_rnn_flag(monkeypatch):
    """A torch with matmul/conv fp32_precision but no cudnn.rnn.fp32_precision: the two it has are set."""
    import types

    monkeypatch.setattr(torch.backends.cudnn, "rnn", types.SimpleNamespace())
    flags = devices._precision_flags()
    assert [label for label, _, _ in flags] == ["matmul", "cuDNN conv"]
    with devices.float32_precision("ieee"):
        assert torch.backends.cudnn.conv.fp32_precision == "ieee"


def test_float32_precision_on_torch_before_2_9(monkeypatch):
    """Without the fp32_precision API: the two allow_tf32 flags (cuBLAS, and all of cuDNN) are set and restored."""
    import types

    matmul = types.SimpleNamespace(allow_tf32=True)
    monkeypatch.setattr(torch.backends.cuda, "matmul", matmul)
    assert [(obj, attr) for _, obj, attr in devices._precision_flags()] == [(matmul, "allow_tf32"),
                                                                            (torch.backends.cudnn, "allow_tf32")]
    assert set(devices.float32_settings()) == {"matmul allow_tf32", "cuDNN allow_tf32"}
    with devices.float32_precision("ieee"):
        assert matmul.allow_tf32 is False
    assert matmul.allow_tf32 is True
