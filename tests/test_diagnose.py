"""helpers.diagnose: the bottleneck it names, what it leaves untouched, its limits, its command line (notebook 10)."""
import json
import subprocess
import sys
import time

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from helpers.diagnose import classify, diagnose, doubling_gain, recommend


class SlowDataset(Dataset):
    """Each item costs 5 ms of 'decoding' (a sleep): a pipeline far slower than a tiny model."""

    def __len__(self):
        return 256

    def __getitem__(self, i):
        time.sleep(0.005)
        return torch.randn(16, generator=torch.Generator().manual_seed(i)), i % 4


def tiny():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def test_an_input_bound_loader_is_diagnosed_as_input_bound():
    model = tiny()
    result = diagnose(model, DataLoader(SlowDataset(), batch_size=32, shuffle=True), nn.CrossEntropyLoss(),
                      torch.optim.SGD(model.parameters(), lr=0.1), device="cpu", budget_s=20)
    assert result.bottleneck == "input", result.reason
    assert "the input is the slower side" in result.reason
    assert result.phase_ms["data wait"] > 0.5 * sum(result.phase_ms.values())
    assert result.input_items_per_s < result.model_items_per_s
    # How much workers help depends on spare cores (this CI box has 2: one worker); the ranking itself is tested
    # deterministically in test_classify_and_recommend_follow_the_measurements.
    assert "workers" in result.levers or "workers" in result.not_measured


def test_model_optimizer_and_rng_are_untouched():
    model = tiny()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(64, 16), torch.randint(0, 4, (64,)))
    loader = DataLoader(data, batch_size=16, shuffle=True)
    x, y = data.tensors
    nn.CrossEntropyLoss()(model(x), y).backward()
    opt.step()  # the optimizer has state (Adam moments) that must survive unchanged
    before = {k: v.clone() for k, v in model.state_dict().items()}
    grads = [p.grad.clone() for p in model.parameters()]
    opt_before = {k: v.clone() for k, v in opt.state[next(model.parameters())].items()}
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    diagnose(model, loader, nn.CrossEntropyLoss(), opt, device="cpu", budget_s=5)
    assert torch.equal(torch.rand(3), expected), "the RNG stream moved"
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), f"{k} changed"
    for k, v in opt.state[next(model.parameters())].items():
        assert torch.equal(v, opt_before[k]), f"optimizer state {k} changed"
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads)), "gradients changed"


def test_a_model_over_a_planted_memory_limit_is_reported_not_crashed():
    model = nn.Sequential(nn.Linear(256, 4096), nn.ReLU(), nn.Linear(4096, 4))
    data = TensorDataset(torch.randn(512, 256), torch.randint(0, 4, (512,)))
    result = diagnose(model, DataLoader(data, batch_size=256), device="cpu", budget_s=10, memory_limit_mb=1)
    assert result.bottleneck == "memory"
    assert "does not fit" in result.reason and "1 MB limit" in result.reason
    assert result.recommendations == [] and "does not fit" in result.markdown()


def test_a_bigger_batch_that_does_not_fit_is_reported_as_such():
    import copy

    from helpers.diagnose import _step
    from helpers.profiling import profiler_peak_mb

    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(8) for m in (nn.Linear(256, 256), nn.ReLU())], nn.Linear(256, 4))
    data = TensorDataset(torch.randn(1024, 256), torch.randint(0, 4, (1024,)))
    work = copy.deepcopy(model)
    batch = (data.tensors[0], data.tensors[1])
    one = profiler_peak_mb(lambda: _step(work, torch.optim.SGD(work.parameters(), lr=0.01), batch,
                                         torch.device("cpu"), nn.CrossEntropyLoss(), ()))
    result = diagnose(model, DataLoader(data, batch_size=1024), device="cpu", budget_s=10,
                      memory_limit_mb=1.3 * one, levers=["batch"])
    assert result.bottleneck != "memory", result.reason  # batch 1024 fits ...
    assert "does not fit" in result.not_measured["batch"], result.not_measured  # ... 2048 does not


def test_classify_and_recommend_follow_the_measurements():
    phases = {"data wait": 1.0, "host to device": 0.1, "forward": 3.0, "backward": 5.0, "optimizer": 1.0}
    assert classify(phases, 1e5, 1e3, 1.5)[0] == "overhead"
    assert doubling_gain({8: 8.0, 16: 12.0, 32: 20.0}, 8) == pytest.approx(4 / 3)  # t = 4 + 0.5 B: half is fixed
    assert doubling_gain({8: 8.0, 16: 16.0}, 8) == pytest.approx(1.0)  # no fixed part: twice the batch, same items/s
    assert "about 67% of the step costs the same whatever the batch" in classify(phases, 1e5, 1e3, 1.5)[1]  # 2 - 2/1.5
    assert classify(phases, 1e5, 1e3, 1.2)[0] == "compute"
    assert classify(phases, 500, 1e3, 1.1)[0] == "input"
    assert classify(dict(phases, **{"data wait": 3.0}), 1e5, 1e3, 1.1)[0] == "input"  # waits 25 % of the step
    assert classify(dict(phases, **{"host to device": 9.0}), 1e5, 1e3, 1.1)[0] == "transfer"
    levers = {"amp": {"speedup": 2.0, "what": "bf16"}, "channels_last": {"speedup": 1.01, "what": "cl"},
              "workers": {"speedup": 1.3, "what": "w"}}
    ranked = recommend(levers, {"data wait": 4.0, "forward": 2.0, "backward": 2.0})  # a step of 8 ms, 4 waiting
    assert [r["lever"] for r in ranked] == ["amp", "workers"]
    assert ranked[0]["step_speedup"] == round(8 / (4 + 4 / 2), 3)  # the wait stays: 1.333, not 2
    capped = recommend(levers, {"data wait": 4.0, "forward": 2.0, "backward": 2.0}, input_cap=1.1)
    assert [(r["lever"], r["step_speedup"]) for r in capped] == [("workers", 1.3), ("amp", 1.1)]


def test_an_lr_scheduler_does_not_let_the_copies_step_the_learners_model():
    """A scheduler wraps optimizer.step in a closure over the original optimizer; deepcopy keeps that closure."""
    model = tiny()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    data = TensorDataset(torch.randn(64, 16), torch.randint(0, 4, (64,)))
    nn.CrossEntropyLoss()(model(data.tensors[0]), data.tensors[1]).backward()  # leftover gradients to step with
    before = {k: v.clone() for k, v in model.state_dict().items()}
    diagnose(model, DataLoader(data, batch_size=16), nn.CrossEntropyLoss(), opt, device="cpu", budget_s=3,
             levers=["batch"])
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items()), "the learner's model was stepped"
    assert opt.state == {} or all(not s for s in opt.state.values()), "the learner's optimizer gained state"


def test_loaders_it_cannot_use_get_one_clear_error():
    model = tiny()
    one_shot = iter([(torch.randn(4, 16), torch.tensor([0, 1, 2, 3]))])
    with pytest.raises(ValueError, match="not a one-shot iterator"):
        diagnose(model, one_shot, device="cpu")
    with pytest.raises(ValueError, match=r"must be \(\*inputs, target\)"):
        diagnose(model, [{"x": torch.randn(4, 16), "y": torch.tensor([0, 1, 2, 3])}], device="cpu")


def test_command_line_json_and_its_errors(tmp_path):
    script = tmp_path / "mine.py"
    script.write_text(
        "import torch\nfrom torch import nn\nfrom torch.utils.data import DataLoader, TensorDataset\n"
        "def make_model():\n    return nn.Linear(8, 3)\n"
        "def make_loader():\n    return DataLoader(TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,))),"
        " batch_size=8)\n"
        "def make_optimizer(model):\n    return torch.optim.SGD(model.parameters(), lr=0.1)\n")
    done = subprocess.run([sys.executable, "-m", "helpers.diagnose", str(script), "--device", "cpu", "--budget-s",
                           "5", "--json"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["bottleneck"] in ("input", "transfer", "overhead", "compute", "memory")
    assert set(out["phase_ms"]) == {"data wait", "host to device", "forward", "backward", "optimizer"}
    for rec in out["recommendations"]:
        assert {"lever", "measured_speedup", "lesson"} <= set(rec)
    bad = tmp_path / "bad.py"
    bad.write_text("def make_model():\n    pass\n")
    done = subprocess.run([sys.executable, "-m", "helpers.diagnose", str(bad)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == f"error: {bad} must define make_loader, make_optimizer"


@pytest.mark.parametrize("device", ["cuda"] if not torch.cuda.is_available() else [])
def test_asking_for_an_absent_gpu_is_one_clear_error(device, tmp_path):
    with pytest.raises(ValueError, match="CUDA is not available"):
        diagnose(tiny(), [(torch.randn(2, 16), torch.tensor([0, 1]))], device=device)


def test_the_compile_lever_reports_compile_time_and_break_even():
    """torch.compile runs on the CPU too (inductor with the C++ compiler): the lever's code path, measured."""
    model = tiny()
    data = TensorDataset(torch.randn(128, 16), torch.randint(0, 4, (128,)))
    result = diagnose(model, DataLoader(data, batch_size=32), device="cpu", budget_s=120, levers=["compile"])
    got = result.levers.get("compile") or result.not_measured["compile"]
    if isinstance(got, str):  # no C++ compiler: said, not crashed
        assert got.startswith("torch.compile failed here:"), got
    else:
        assert got["compile_seconds"] > 0 and "s to compile" in got["what"], got
        assert got["break_even_steps"] is None or got["break_even_steps"] > 0
