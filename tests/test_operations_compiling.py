"""helpers.operations (the three regimes) and helpers.compiling (the compile comparison, fusion, graph breaks)
(notebook 08)."""
import pytest
import torch
from torch import nn

from helpers import compiling, operations


def test_records_count_flops_and_bytes():
    mm = operations.matmul_rate(64, "cpu", min_run_time=0.02)
    assert mm["intensity"] == pytest.approx(2 * 64**3 / (3 * 64 * 64 * 4))
    assert mm["gflops"] == pytest.approx(2 * 64**3 / mm["seconds"] / 1e9)
    add = operations.elementwise_rate(1000, "cpu", min_run_time=0.02)
    assert add["intensity"] == pytest.approx(1 / 12)
    cp = operations.copy_bandwidth(1000, "cpu", min_run_time=0.02)
    assert cp["gflops"] == 0 and cp["gbps"] == pytest.approx(8000 / cp["seconds"] / 1e9)
    tiny = operations.overhead_rate("cpu", ops=50, min_run_time=0.02)
    assert tiny["us_per_op"] == pytest.approx(tiny["seconds"] / 50 * 1e6)


def test_regime_classification():
    peak_gflops, peak_gbps, overhead_us = 1000.0, 100.0, 5.0
    compute = {"seconds": 1.0, "gflops": 800.0, "gbps": 10.0}
    memory = {"seconds": 1.0, "gflops": 5.0, "gbps": 60.0}
    overhead = {"seconds": 200 * 6e-6, "gflops": 0.001, "gbps": 0.01, "ops": 200}
    assert operations.regime(compute, peak_gflops, peak_gbps, overhead_us) == "compute"
    assert operations.regime(memory, peak_gflops, peak_gbps, overhead_us) == "memory"
    assert operations.regime(overhead, peak_gflops, peak_gbps, overhead_us) == "overhead"


def test_fusion_byte_counts_and_graph_breaks():
    x = torch.randn(10)
    assert torch.allclose(compiling.elementwise_chain(x), torch.sigmoid(torch.tanh(x * 0.5 + 0.25) * x - 0.125) * 1.5 + x)
    lin = compiling.graph_breaks(nn.Linear(4, 2), torch.randn(3, 4))
    assert (lin["graphs"], lin["graph_breaks"]) == (1, 0)
    lstm = compiling.graph_breaks(nn.LSTM(3, 4, batch_first=True), torch.randn(2, 5, 3))
    assert (lstm["graphs"], lstm["graph_breaks"]) == (0, 0), "no trace of nn.LSTM without _dynamo.config.allow_rnn"


def test_compare_compiled_reports_instead_of_crashing(monkeypatch):
    def no_compiler(*a, **k):
        raise RuntimeError("no C++ compiler found\nmore text")

    monkeypatch.setattr(torch, "compile", no_compiler)
    make = lambda: nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))  # noqa: E731
    batch = (torch.randn(16, 8), torch.randint(0, 2, (16,)))
    out = compiling.compare_compiled(make, batch, "cpu", min_run_time=0.02)
    assert out["error"] == "RuntimeError: no C++ compiler found" and out["eager_ms"] > 0


def test_compare_compiled_measures_a_real_compile():
    make = lambda: nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))  # noqa: E731
    batch = (torch.randn(16, 8), torch.randint(0, 2, (16,)))
    compiling.compare_compiled(make, batch, "cpu", min_run_time=0.05)  # fills inductor's on-disk cache, if used
    out = compiling.compare_compiled(make, batch, "cpu", min_run_time=0.05)
    assert "error" not in out, out
    assert out["compile_seconds"] > 0.1, "compiling a forward and backward graph takes time (not a cache load)"
    assert out["speedup"] == pytest.approx(out["eager_ms"] / out["compiled_ms"])
    if out["break_even_steps"] is not None:
        gain = (out["eager_ms"] - out["compiled_ms"]) / 1e3
        assert out["break_even_steps"] == pytest.approx(out["compile_seconds"] / gain)


def test_a_channels_last_compare_compiles_once(monkeypatch):
    """The first, timed call compiles for the layout the timed steps use (it once ran on a contiguous batch, so the
    steady steps compiled a second graph for channels-last strides and compile_seconds held half the cost)."""
    real, graphs, at_first = torch.compile, [], []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    first = compiling._first_call_seconds
    monkeypatch.setattr(torch, "compile", lambda model, mode=None: real(model, backend=counting))
    monkeypatch.setattr(compiling, "require_compiler", lambda: None)
    monkeypatch.setattr(compiling, "_first_call_seconds", lambda *a: (first(*a), at_first.append(len(graphs)))[0])
    make = lambda: nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))  # noqa: E731
    batch = (torch.randn(8, 3, 8, 8), torch.randint(0, 2, (8,)))
    out = compiling.compare_compiled(make, batch, "cpu", channels_last=True, min_run_time=0.02)
    assert "error" not in out, out
    assert at_first == [len(graphs)] and graphs, f"{len(graphs)} graphs, {at_first} of them at the first call"
