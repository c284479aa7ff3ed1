"""helpers.ceilings and helpers.predictions: measured ceilings (cached), the GPU datasheet (every number sourced), predict_step."""
import copy
from types import SimpleNamespace
import json
import math

import pytest
import torch

from helpers import ceilings, predictions
from helpers.ceilings import datasheet, datasheet_ceilings, measured_ceilings
from helpers.predictions import predict_step

GPUS = ("A100 80GB SXM", "H100 SXM", "H100 PCIe", "H200 SXM", "L4", "T4", "GeForce RTX 4090")


def synthetic_work(**extra):
    """A matmul (2 GFLOP, 1 MB) and two adds (0.4 GB each, no FLOPs counted), 10 operators of which 3 kernels."""
    rows = [{"op": "aten.mm", "dtype": "float32", "flops": 2_000_000_000, "bytes": 1_000_000, "kernel": True,
             "calls": 1},
            {"op": "aten.add", "dtype": "float32", "flops": 0, "bytes": 400_000_000, "kernel": True, "calls": 2}]
    return {"rows": rows, "ops": 10, "kernels": 3, "h2d_bytes": 0, **extra}


def test_predict_step_on_a_cpu_adds_host_and_device_time():
    ceilings = {"flops_per_s": {"float32": 1e12}, "bytes_per_s": 1e11, "op_s": 1e-5, "overlap": False}
    p = predict_step(synthetic_work(), ceilings)
    assert p["compute_s"] == pytest.approx(2e-3)    # 2e9 / 1e12; its 1 MB would take 1e-5 s
    assert p["memory_s"] == pytest.approx(8e-3)     # 2 × 4e8 / 1e11
    assert p["host_s"] == pytest.approx(1e-4)       # 10 operators × 10 µs
    assert p["step_s"] == pytest.approx(2e-3 + 8e-3 + 1e-4)
    assert p["bound"] == "memory" and not p["overlap"]
    assert p["top_ops_s"] == pytest.approx({"aten.add": 8e-3, "aten.mm": 2e-3})


def test_predict_step_on_a_gpu_takes_the_slower_of_host_and_device():
    gpu = {"flops_per_s": {"float32": 1e12, "bfloat16": 4e12}, "bytes_per_s": 1e11, "op_s": 2e-3, "launch_s": 1e-6,
           "overlap": True, "h2d_bytes_per_s": 1e10}
    host_bound = predict_step(synthetic_work(h2d_bytes=10_000_000), gpu)
    device = 2e-3 + 8e-3 + 1e-3                # compute, memory, 1e7 bytes over the link
    assert host_bound["device_s"] == pytest.approx(device)
    host = 10 * 2e-3 + 3 * 1e-6                # 10 operators dispatched, 3 kernels launched: the host's work
    assert host_bound["host_s"] == pytest.approx(host)
    assert host_bound["step_s"] == pytest.approx(host) and host_bound["bound"] == "overhead"
    fast_host = predict_step(synthetic_work(), {**gpu, "op_s": 1e-7})
    assert fast_host["step_s"] == pytest.approx(2e-3 + 8e-3) and fast_host["bound"] == "memory"
    work = synthetic_work()
    work["rows"][0]["dtype"] = "bfloat16"   # the matmul now runs at the bf16 peak
    assert predict_step(work, {**gpu, "op_s": 1e-7})["compute_s"] == pytest.approx(5e-4)


def test_predict_gpus_labels_each_and_skips_a_gpu_without_the_peak():
    found = predictions.predict_gpus(synthetic_work(input_bytes=10_000_000), ("T4", "H200 SXM"), op_s=1e-5)
    assert found["T4"]["label"] == predictions.PREDICTED and "predicted" in found["T4"]["label"]
    assert found["T4"]["transfer_s"] > 0, "counted on a CPU, the batch a GPU would copy crosses the host link"
    launch = ceilings.launch_cost()
    assert launch["value"] == 5e-6 and "5-20 microseconds" in launch["quote"] and launch["url"].startswith("http")
    assert found["T4"]["host_s"] == pytest.approx(10 * 1e-5 + 3 * launch["value"])
    assert "float32" in found["H200 SXM"]["skipped"], "no FP32 row for the H200: skipped, not guessed"


def test_mfu_divides_by_the_measured_peak_of_the_dtype():
    peaks = {"flops_per_s": {"float32": 2e11, "bfloat16": 8e11}, "device": "cpu", "hardware": "test-cpu"}
    assert ceilings.mfu(5e10, "cpu", "float32", ceilings=peaks)["mfu"] == pytest.approx(0.25)
    found = ceilings.mfu(2e11, "cpu", "bfloat16", ceilings=peaks)
    assert found["mfu"] == pytest.approx(0.25) and "datasheet_mfu" not in found and "test-cpu" in found["peak"]
    assert ceilings.mfu(1e10, "cpu", "float16", ceilings=peaks)["peak_flops_per_s"] == 2e11  # fp32 fallback


@pytest.mark.parametrize("device_name, entry", [("NVIDIA H100 80GB HBM3", "H100 SXM"), ("NVIDIA H100 PCIe", "H100 PCIe"),
                                                ("NVIDIA H200", "H200 SXM"), ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM"),
                                                ("Tesla T4", "T4"), ("NVIDIA L4", "L4"), ("NVIDIA A10G", None),
                                                ("NVIDIA GeForce RTX 4090", "GeForce RTX 4090")])
def test_a_cuda_device_name_finds_its_datasheet_entry(monkeypatch, device_name, entry):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: device_name)
    assert ceilings.datasheet_name("cuda:0") == entry
    assert ceilings.datasheet_name("cpu") is None


def test_predict_step_names_compute_when_the_matmul_dominates():
    work = synthetic_work()
    work["rows"][0]["flops"] = 2_000_000_000_000
    p = predict_step(work, {"flops_per_s": {"float32": 1e12}, "bytes_per_s": 1e11, "op_s": 1e-5, "overlap": False})
    assert p["bound"] == "compute" and p["compute_s"] == pytest.approx(2.0)


def fake_measure(calls):
    def measure(device, min_run_time):
        calls.append(str(device))
        return {"flops_per_s": {"float32": 1e11}, "matmul": [], "bytes_per_s": 1e10, "copy_bytes": 1,
                "op_s": 5e-6, "launch_s": 0.0, "overlap": False, "seconds_to_measure": 0.0}
    return measure


def test_ceilings_are_measured_once_per_machine_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(ceilings.os, "getloadavg", lambda: (0.5, 0.5, 0.5))  # a quiet machine, whatever runs now
    calls = []
    monkeypatch.setattr(ceilings, "_measure", fake_measure(calls))
    first = measured_ceilings("cpu")
    second = measured_ceilings("cpu")
    assert calls == ["cpu"], "the second call reads the cache"
    assert (first["cached"], second["cached"]) == (False, True)
    assert second["cache"].startswith(str(tmp_path / "gpu-course" / "ceilings"))
    assert torch.__version__ in second["key"] and second["flops_per_s"] == {"float32": 1e11}
    measured_ceilings("cpu", refresh=True)
    assert calls == ["cpu", "cpu"]


def test_ceilings_measured_on_a_busy_machine_are_measured_again_once_it_is_quieter(tmp_path, monkeypatch):
    """A peak measured while more programs ran than there are CPUs is low: every MFU after it would be too high."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(ceilings, "usable_cpus", lambda: 2)
    calls, load = [], [3.0]
    monkeypatch.setattr(ceilings.os, "getloadavg", lambda: (load[0], 1.0, 1.0))
    monkeypatch.setattr(ceilings, "_measure", fake_measure(calls))
    assert measured_ceilings("cpu")["load_average"] == 3.0
    assert measured_ceilings("cpu")["cached"] and len(calls) == 1, "still busy: the cache is what there is"
    assert measured_ceilings("cpu", measure=False)["cached"], "a DDP rank that may not measure reads it"
    load[0] = 1.5
    again = measured_ceilings("cpu")
    assert not again["cached"] and again["load_average"] == 1.5 and len(calls) == 2
    load[0] = 0.2
    assert measured_ceilings("cpu")["cached"] and len(calls) == 2, "measured at 1.5 on 2 CPUs: kept"


def test_matmul_peak_is_the_best_of_several_sizes():
    found = ceilings.matmul_peak("cpu", dtypes=("float32",), sizes=(32, 96), min_run_time=0.01)
    rates = [p["flops_per_s"] for p in found["matmul"]]
    assert [p["n"] for p in found["matmul"]] == [32, 96]
    assert found["flops_per_s"] == {"float32": max(rates)}


@pytest.mark.parametrize("native", [True, False])
def test_an_emulated_bf16_is_timed_at_the_smallest_size_only(monkeypatch, native):
    """A CPU without bf16 instructions multiplies bf16 about 100 times slower than fp32 (2-core AMD EPYC without
    AVX-512 BF16): at the largest size one product took seconds and the ceilings step of gpu-check ran past its
    5-minute limit. Forced both ways here, whatever this CPU has."""
    import helpers.devices

    monkeypatch.setattr(helpers.devices, "cpu_bf16_native", lambda: native)
    found = ceilings.matmul_peak("cpu", dtypes=("float32", "bfloat16"), sizes=(32, 64), min_run_time=0.01)
    bf16 = [p for p in found["matmul"] if p["dtype"] == "bfloat16"]
    assert [p["n"] for p in bf16] == ([32, 64] if native else [32])
    assert all(p.get("emulated", False) is not native for p in bf16)
    assert len([p for p in found["matmul"] if p["dtype"] == "float32"]) == 2


def test_the_copy_is_far_larger_than_the_caches(monkeypatch):
    monkeypatch.setattr(ceilings, "last_level_cache_bytes", lambda device: 512 * 2**20)
    n = ceilings.copy_elements(torch.device("cpu"))
    assert 2 * n * 4 >= 4 * 512 * 2**20 or n * 4 * 8 >= 0.9 * _free_bytes(), "4× the cache, unless memory is short"


def _free_bytes():
    import os
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


# ---------------------------------------------------------------- the datasheet

def unsourced(data: dict) -> list:
    """Every number in the datasheet that lacks a known source or a quote, as 'path: why'."""
    problems, sources = [], data.get("sources", {})

    def visit(node, path):
        if isinstance(node, dict):
            numbers = [k for k, v in node.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
            if numbers and path[0] in ("gpus", "launch_s"):
                if node.get("source") not in sources:
                    problems.append(f"{'/'.join(path)}: source {node.get('source')!r} is not in sources")
                if not str(node.get("quote", "")).strip():
                    problems.append(f"{'/'.join(path)}: no quote")
            for k, v in node.items():
                visit(v, path + [k])
        elif isinstance(node, list):
            for i, v in enumerate(node):
                visit(v, path + [str(i)])

    visit(data.get("gpus", {}), ["gpus"])
    visit(data.get("launch_s", {}), ["launch_s"])
    for sid, src in sources.items():
        if not (src.get("title") and str(src.get("url", "")).startswith("http")):
            problems.append(f"sources/{sid}: needs a title and a URL")
    return problems


def raw_datasheet():
    return json.loads(ceilings.datasheet_path().read_text())


def test_every_number_in_the_datasheet_has_a_source():
    assert unsourced(raw_datasheet()) == []


def test_the_source_check_can_fail():
    data = copy.deepcopy(raw_datasheet())
    row = data["gpus"]["H100 SXM"]["bytes_per_s"]
    row.pop("quote")
    data["gpus"]["L4"]["flops_per_s"]["float32"]["source"] = "nowhere"
    assert len(unsourced(data)) == 2


def test_the_datasheet_covers_the_gpus_a_learner_meets_with_dense_peaks():
    gpus = datasheet()
    assert set(GPUS) <= set(gpus)
    for name, entry in gpus.items():
        assert entry["bytes_per_s"]["value"] > 0, name
        for dtype, row in entry["flops_per_s"].items():
            assert dtype in ("float32", "tf32", "bfloat16", "float16"), (name, dtype)
            if row.get("sparse_in_source"):  # the source printed the 2:4-sparsity figure: we store half of it
                assert row["value"] == pytest.approx(row["printed"] / 2), (name, dtype)
            else:
                assert row["value"] == pytest.approx(row["printed"]), (name, dtype)
        if "tf32" in entry["flops_per_s"] and "float32" in entry["flops_per_s"]:
            assert entry["flops_per_s"]["tf32"]["value"] != entry["flops_per_s"]["float32"]["value"] or \
                "GeForce" in name, f"{name}: FP32 and TF32 are separate rows with their own numbers"


def test_datasheet_ceilings_feed_predict_step():
    h100 = datasheet()["H100 SXM"]
    ceilings = datasheet_ceilings(h100, op_s=1e-5)
    assert ceilings["overlap"] and ceilings["bytes_per_s"] == h100["bytes_per_s"]["value"]
    assert ceilings["h2d_bytes_per_s"] == pytest.approx(63.0e9, rel=0.01), "PCIe Gen5 x16, one direction"
    p = predict_step(synthetic_work(), ceilings)
    assert math.isfinite(p["step_s"]) and p["step_s"] > 0
    with pytest.raises(ValueError, match="no published peak"):
        datasheet_ceilings(datasheet()["Apple M2 Ultra"], op_s=1e-5)


def test_a_missing_peak_is_an_error_not_a_guess():
    h200 = datasheet_ceilings(datasheet()["H200 SXM"], op_s=1e-5)   # no FP32 row in the datasheet
    bf16 = synthetic_work()
    bf16["rows"][0]["dtype"] = "bfloat16"  # the adds are fp32 but do no FLOPs: they need no peak
    assert predict_step(bf16, h200)["compute_s"] == pytest.approx(2e9 / 989.5e12)
    with pytest.raises(ValueError, match="no peak for float32"):
        predict_step(synthetic_work(), h200)


def test_the_gpu_in_use_joins_the_predictions_when_the_datasheet_knows_it(monkeypatch):
    monkeypatch.delenv("COURSE_GPUS", raising=False)  # make test sets "all" for the notebooks
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    assert predictions.gpus_here() == predictions.DEFAULT_GPUS + ("H200 SXM",)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    assert predictions.gpus_here() == predictions.DEFAULT_GPUS, "already among the defaults: not twice"
    assert predictions.gpus_here(["L4"]) == ("L4",)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert predictions.gpus_here() == predictions.DEFAULT_GPUS


def test_measured_over_predicted_pairs_what_both_hold():
    measured = {"conv": {"8": 2.0, "64": 4.0}, "lstm": 3.0, "copy": None, "only here": 1.0}
    predicted = {"conv": {"8": 1.0, "64": 0.0}, "lstm": 1.5, "copy": 2.0}
    assert predictions.measured_over_predicted(measured, predicted) == {"conv": {"8": 2.0}, "lstm": 2.0}
    assert predictions.measured_over_predicted({"a": {"b": 1.0}}, {"a": {"c": 1.0}}) == {}


def test_fp16_is_predicted_from_the_bf16_count_relabelled(monkeypatch):
    """A T4 runs autocast in fp16 (no bf16 peak in its datasheet): the step is counted once, in bf16, and its
    bf16 operators are predicted at the T4's fp16 peak; nothing is counted in fp16 on the CPU."""

    counted = []

    def fake_count(model, batch, device, amp=False, **kw):
        counted.append(amp)
        return synthetic_work(input_bytes=0) | {"rows": [dict(r, dtype="bfloat16" if amp else "float32")
                                                         for r in synthetic_work()["rows"]]}

    monkeypatch.setattr(predictions, "count_step", fake_count)
    batch = (torch.zeros(4, 3), torch.zeros(4, dtype=torch.long))
    found = predictions.predicted_training(lambda: None, batch, images=8, amp=True, gpus=("T4", "A100 80GB SXM"),
                                            op_s=1e-9)
    assert counted == ["bfloat16"], counted
    assert found["T4"]["dtype"] == "float16" and found["A100 80GB SXM"]["dtype"] == "bfloat16"
    t4_fp16 = datasheet()["T4"]["flops_per_s"]["float16"]["value"]
    assert found["T4"]["step_s"] >= 2e9 / t4_fp16 and found["T4"]["epoch_s"] == pytest.approx(2 * found["T4"]["step_s"])


def test_gpu_predictions_count_the_optimizer_as_cuda_runs_it():
    """On CUDA tensors torch.optim defaults to its foreach kernels: the count behind a GPU prediction has fewer
    operators than the CPU's for-loop count of the same step (SGD on a multi-layer model)."""
    from helpers.models import ConvBlockNet
    from helpers.counting import count_step

    batch = (torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,)))
    cpu = count_step(ConvBlockNet(depth=2), batch, "cpu")
    sweep = predictions.predicted_sweep({4: (ConvBlockNet(depth=2), batch)}, ("T4",), op_s=1e-6)
    assert sweep["work"][4]["ops"] < cpu.ops and sweep["work"][4]["flops"] == cpu.flops, (sweep["work"], cpu.ops)
    light = predictions.check_predictions({"net": {"model": ConvBlockNet(depth=2), "batch": batch}}, "cpu",
                                           ceilings={"flops_per_s": {"float32": 1e11}, "bytes_per_s": 1e10,
                                                     "op_s": 1e-5, "overlap": False, "device": "cpu"},
                                           min_run_time=0.01, gpus=("T4",))
    assert light["net"]["ops"] == cpu.ops, "the CPU's own prediction keeps the CPU's count"


def test_a_sweep_can_predict_the_step_with_its_batch_resident(monkeypatch):
    """time_train_step keeps the batch on the device: the prediction compared with it copies nothing."""
    from helpers.models import ConvBlockNet

    seen, predict = [], predictions.predict_gpus
    monkeypatch.setattr(predictions, "predict_gpus", lambda *a, **kw: seen.append(kw["copy_batch"]) or predict(*a, **kw))
    batch = (torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,)))
    for flag in (True, False):
        predictions.predicted_sweep({4: (ConvBlockNet(depth=1), batch)}, ("T4",), op_s=0.0, copy_batch=flag)
    assert seen == [True, False]
    work = synthetic_work(input_bytes=10**9)  # a large batch: its copy shows in the step
    assert predict(work, ("T4",), op_s=0.0, copy_batch=False)["T4"]["step_s"] < \
        predict(work, ("T4",), op_s=0.0)["T4"]["step_s"]


def test_predicted_matmul_names_the_regime_that_binds():
    """A small product is bound by the host's launches, a large one by the datasheet's compute peak."""
    found = predictions.predicted_matmul([64, 8192], "float32", ("A100 80GB SXM",), op_s=1e-5, detail=True)
    small, large = found["A100 80GB SXM"][64], found["A100 80GB SXM"][8192]
    assert small["bound"] == "overhead" and large["bound"] == "compute", found
    assert large["gflops"] == pytest.approx(predictions.predicted_matmul([8192], "float32", ("A100 80GB SXM",),
                                                                          op_s=1e-5)["A100 80GB SXM"][8192])


def test_course_gpus_chooses_the_gpus_predicted_for(monkeypatch):
    """$COURSE_GPUS: unset, the defaults; 'all', every datasheet entry; a list, those; a wrong name, one line."""
    from helpers import ceilings, predictions

    monkeypatch.delenv("COURSE_GPUS", raising=False)
    assert predictions.chosen_gpus() == predictions.DEFAULT_GPUS
    monkeypatch.setenv("COURSE_GPUS", "all")
    assert set(predictions.chosen_gpus()) == set(ceilings.datasheet()) and "H200 SXM" in predictions.gpus_here()
    monkeypatch.setenv("COURSE_GPUS", "T4, H200 SXM")
    assert predictions.gpus_here() == ("T4", "H200 SXM")
    monkeypatch.setenv("COURSE_GPUS", "T4,B200")
    with pytest.raises(ValueError, match="'B200'.*choose from"):
        predictions.chosen_gpus()


def test_a_gpu_without_the_dtype_is_said_not_dropped(monkeypatch):
    """The H200's datasheet entry has no FP32 row: an fp32 step is skipped for it, with the reason said once."""
    from helpers import predictions

    from helpers.counting import count_fn

    a = torch.randn(256, 256)
    work = count_fn(lambda x: x @ a, torch.randn(256, 256))  # an fp32 matmul
    said = []
    got = predictions.usable(predictions.predict_gpus(work, ("T4", "H200 SXM"), op_s=1e-6), say=said.append)
    assert list(got) == ["T4"] and "step_s" in got["T4"]
    assert len(said) == 1 and said[0].startswith("H200 SXM: not predicted (") and "float32" in said[0]


def test_check_predictions_times_in_true_fp32(monkeypatch):
    """The fp32 peak a measurement is divided by is true fp32's: the timing runs with TF32 off for matmuls, cuDNN
    convolutions and cuDNN RNNs (on Ampere and newer, cuDNN would run TF32 by default), and the settings return."""
    from helpers import devices

    seen = []

    def fake_time_fn(fn, device, **kw):
        seen.append(devices.float32_settings())
        assert torch.backends.cudnn.allow_tf32 is False and torch.backends.cuda.matmul.allow_tf32 is False
        return SimpleNamespace(median_s=1e-3)

    monkeypatch.setattr(predictions, "time_fn", fake_time_fn)
    before = devices.float32_settings()
    ceilings = {"flops_per_s": {"float32": 1e11}, "bytes_per_s": 1e10, "op_s": 1e-6, "device": "cpu"}
    predictions.check_predictions({"mm": dict(fn=torch.mm, args=[torch.randn(8, 8), torch.randn(8, 8)])}, "cpu",
                                   ceilings=ceilings, gpus=("T4",))
    assert seen and all("tf32" not in s.values() for s in seen), seen  # "none": the parent's, true fp32
    assert devices.float32_settings() == before


def test_a_fraction_above_the_ceiling_is_returned_and_explained_not_raised():
    """Notebook 02's "fraction of the ceiling": a workload above its matmul ceiling can be real on a GPU (cuDNN's
    Winograd or FFT convolutions do fewer operations than the direct count), so it is returned and flagged with both
    likely causes, and the notebook goes on (issue 36)."""
    fractions = ceilings.ceiling_fractions({"conv net": 30.0, "BiLSTM": 3.0}, 120.0)
    assert fractions == {"conv net": 0.25, "BiLSTM": 0.025} and ceilings.above_ceiling(fractions) == []
    beaten = ceilings.ceiling_fractions({"conv net": 150.0, "BiLSTM": 3.0}, 120.0)
    assert beaten == {"conv net": 1.25, "BiLSTM": 0.025}
    lines = ceilings.above_ceiling(beaten)
    assert len(lines) == 1 and lines[0].startswith("conv net: 125% of the fp32 matmul ceiling")
    assert "Winograd" in lines[0] and "TF32" in lines[0]
    with pytest.raises(ValueError, match="positive"):
        ceilings.ceiling_fractions({"conv net": 1.0}, 0.0)
