"""Unit tests of helpers.timing: the clock must wait for queued (asynchronous) work."""
import threading
import time

import pytest
import torch

from helpers import timing


class FakeAsyncDevice:
    """Stands in for a GPU: ``launch`` returns at once, the work finishes 20 ms later; ``sync`` waits."""

    def __init__(self, work_s=0.02):
        self.work_s = work_s
        self.pending = []

    def launch(self):
        done = threading.Event()
        threading.Timer(self.work_s, done.set).start()
        self.pending.append(done)

    def sync(self):
        while self.pending:
            self.pending.pop().wait()


@pytest.mark.serial  # a 20 ms wait seen on the clock: not while another test loads the cores
def test_synchronised_timer_sees_the_asynchronous_work():
    dev = FakeAsyncDevice()

    def clock():
        dev.sync()
        return time.perf_counter()

    t = timing.time_fn(dev.launch, label="fake kernel", clock=clock, warmup=1, min_run_time=0.1)
    assert t.median_s >= 0.018, t
    wrong = timing.time_unsynchronised(dev.launch, repeats=5)
    dev.sync()
    assert wrong < t.median_s / 4, "launching is quick; only a synchronised clock sees the 20 ms"


def test_cpu_timing_record():
    t = timing.time_fn(lambda: time.sleep(0.002), "cpu", label="sleep", min_run_time=0.05)
    assert t.device == "cpu" and t.label == "sleep"
    assert 0.0015 < t.median_s < 1  # seconds: a sleep of 2 ms, however slow the machine (1 catches a ms slip)
    assert t.min_s <= t.median_s <= t.max_s and t.iqr_s >= 0 and t.runs == len(t.times_s) >= 1
    assert set(t.state_dict()) >= {"median_s", "iqr_s", "runs", "times_s"}
    assert "sleep on cpu: median" in str(t)


@pytest.mark.parametrize("seconds,text", [(1.5, "1.5 s"), (0.00123, "1.23 ms"), (2.5e-6, "2.5 µs"), (3e-9, "3 ns")])
def test_format_seconds(seconds, text):
    assert timing.format_seconds(seconds) == text


def _conv_problem():
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(4, 2))
    return model, (torch.randn(8, 3, 8, 8), torch.randint(0, 2, (8,)))


def test_time_train_step_trains_and_reports_throughput():
    model, batch = _conv_problem()
    before = [p.detach().clone() for p in model.parameters()]
    t = timing.time_train_step(model, batch, "cpu", min_run_time=0.05, label="tiny conv")
    assert t.items == 8 and t.items_per_s == pytest.approx(8 / t.median_s)
    assert t.label == "tiny conv" and t.device == "cpu"
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters())), "the steps must update weights"


def test_time_train_step_options_reach_the_step(monkeypatch):
    from helpers import step

    seen = {}
    real = step.optimizer_step

    def spy(model, optimizer, inputs, target, **kw):
        seen.setdefault("formats", set()).add(inputs[0].is_contiguous(memory_format=torch.channels_last))
        seen["dtype"], seen["optimizer"] = kw["dtype"], type(optimizer).__name__
        return real(model, optimizer, inputs, target, **kw)

    moves = []
    real_split = step.split_batch

    def split_spy(*args, **kw):
        moves.append(1)
        return real_split(*args, **kw)

    monkeypatch.setattr(step, "optimizer_step", spy)
    monkeypatch.setattr(step, "split_batch", split_spy)
    model, batch = _conv_problem()
    timing.time_train_step(model, batch, "cpu", amp="bf16", channels_last=True, min_run_time=0.02,
                           optimizer=torch.optim.Adam(model.parameters()))
    assert seen["formats"] == {True} and seen["dtype"] is torch.bfloat16 and seen["optimizer"] == "Adam"
    assert len(moves) == 1, "without batch_on_host the batch is moved to the device once and reused"
    seen.clear()
    moves.clear()
    t = timing.time_train_step(model, batch, "cpu", batch_on_host=True, min_run_time=0.02)
    assert seen["dtype"] is None and seen["optimizer"] == "SGD"
    assert len(moves) > t.runs, "with batch_on_host every step moves its batch"
