"""Unit tests of helpers.training: the fit loop, checkpoints, kill-and-resume."""
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from helpers.training import (CheckpointError, History, evaluate, fit, load_checkpoint, predict, previous_path,
                              resolve_amp, save_checkpoint, seed_everything)

ROOT = Path(__file__).resolve().parent.parent
JOB = Path(__file__).with_name("resume_job.py")


def _problem(n=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    y = (x[:, 0] - x[:, 2] > 0).long()
    return TensorDataset(x, y)


def _model():
    return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))


def test_fit_learns_and_records_history():
    seed_everything(0)
    ds = _problem()
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    hist = fit(model, DataLoader(ds, batch_size=16, shuffle=True), epochs=6, optimizer=opt,
               val_loader=DataLoader(ds, batch_size=64), progress=False)
    assert len(hist.iterations) == 6 * 8
    assert [e["epoch"] for e in hist.epochs] == [1, 2, 3, 4, 5, 6]
    assert hist.epochs[-1]["train_loss"] < hist.epochs[0]["train_loss"]
    assert hist.final["val_accuracy"] > 0.9, hist.final
    assert all(e["seconds"] > 0 for e in hist.epochs)
    assert History.from_state_dict(hist.state_dict()) == hist


def test_validation_every_n_iterations_and_scheduler_per_batch():
    ds = _problem(64)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    hist = fit(model, DataLoader(ds, batch_size=16), epochs=2, optimizer=opt, scheduler=sched,
               scheduler_step="batch", val_loader=DataLoader(ds, batch_size=64), val_every=3, progress=False)
    assert [v["iteration"] for v in hist.validation] == [3, 6]
    assert opt.param_groups[0]["lr"] == pytest.approx(0.5 ** 8)


def test_bad_scheduler_step_and_amp_names():
    with pytest.raises(ValueError, match="scheduler_step"):
        fit(_model(), DataLoader(_problem(8)), epochs=1, optimizer=torch.optim.SGD(_model().parameters(), lr=0.1),
            scheduler_step="iteration", progress=False)
    with pytest.raises(ValueError, match="amp="):
        resolve_amp("fp8", torch.device("cpu"))
    assert resolve_amp("bf16", torch.device("cpu")) is torch.bfloat16


def test_auto_amp_on_a_cpu_only_with_bf16_instructions(monkeypatch):
    from helpers import devices

    monkeypatch.setattr(devices, "cpu_flags", lambda: {"avx2", "avx512f", "avx512_bf16"})
    assert resolve_amp(True, torch.device("cpu")) is torch.bfloat16
    monkeypatch.setattr(devices, "cpu_flags", lambda: {"avx2", "fma"})  # bf16 would be emulated: slower than fp32
    assert resolve_amp("auto", torch.device("cpu")) is None
    assert resolve_amp("bf16", torch.device("cpu")) is torch.bfloat16, "asked for explicitly, it is used"
    assert resolve_amp(False, torch.device("cpu")) is None


def test_fit_with_bf16_autocast_on_cpu_learns():
    seed_everything(1)
    ds = _problem(256)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    hist = fit(model, DataLoader(ds, batch_size=32, shuffle=True), epochs=5, optimizer=opt, amp="bf16",
               progress=False)
    assert hist.epochs[-1]["train_loss"] < 0.6 * hist.epochs[0]["train_loss"]
    assert next(model.parameters()).dtype == torch.float32  # autocast never changes the weights' dtype


def test_evaluate_and_predict_agree():
    seed_everything(2)
    ds = _problem(50)
    model = _model()
    scores, targets = predict(model, DataLoader(ds, batch_size=7))
    assert scores.shape == (50, 2) and targets.shape == (50,)
    acc = (scores.argmax(1) == targets).float().mean().item()
    assert evaluate(model, DataLoader(ds, batch_size=7))["accuracy"] == pytest.approx(acc)


def test_host_inputs_stay_on_the_cpu():
    seen = {}

    class Probe(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 2)

        def forward(self, x, lengths):
            seen["lengths_device"] = lengths.device.type
            return self.lin(x)

    ds = TensorDataset(torch.randn(8, 3), torch.arange(8), torch.zeros(8, dtype=torch.long))
    fit(Probe(), DataLoader(ds, batch_size=4), epochs=1, optimizer=torch.optim.SGD(Probe().parameters(), lr=0.1),
        host_inputs=(1,), progress=False)
    assert seen["lengths_device"] == "cpu"


def test_checkpoint_round_trip_and_previous_kept(tmp_path):
    path = tmp_path / "ck.pt"
    save_checkpoint(path, {"a": torch.ones(2), "n": 1})
    save_checkpoint(path, {"a": torch.zeros(2), "n": 2})
    assert load_checkpoint(path)["n"] == 2
    assert load_checkpoint(previous_path(path))["n"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck.prev.pt", "ck.pt"]  # no temp files left


def test_failed_write_leaves_previous_checkpoint_intact(tmp_path, monkeypatch):
    path = tmp_path / "ck.pt"
    save_checkpoint(path, {"n": 1})

    def broken_save(obj, fh, *a, **k):
        fh.write(b"PK\x03\x04 half a file")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, {"n": 2})
    monkeypatch.undo()
    assert load_checkpoint(path)["n"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["ck.pt"]


def test_truncated_checkpoint_gives_clear_error_naming_previous(tmp_path):
    path = tmp_path / "ck.pt"
    save_checkpoint(path, {"w": torch.randn(100)})
    save_checkpoint(path, {"w": torch.randn(100)})
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"truncated or corrupt.*ck\.prev\.pt is intact"):
        load_checkpoint(path)
    assert load_checkpoint(previous_path(path))["w"].shape == (100,)


class _Boom:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_checkpoint_with_arbitrary_pickle_is_refused(tmp_path):
    path = tmp_path / "evil.pt"
    with open(path, "wb") as fh:
        torch.save({"model": {}, "payload": _Boom()}, fh)
    with pytest.raises(CheckpointError, match=r"refused to load .*system"):
        load_checkpoint(path)


def test_resume_from_checkpoint_not_written_by_fit_is_refused(tmp_path):
    path = tmp_path / "other.pt"
    save_checkpoint(path, {"model": {}})
    with pytest.raises(CheckpointError, match="not written by helpers.training.fit"):
        fit(_model(), DataLoader(_problem(8)), epochs=1, optimizer=torch.optim.SGD(_model().parameters(), lr=0.1),
            checkpoint=path, resume=True, progress=False)


def _run_job(*args, timeout=120):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, str(JOB), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)


def test_resume_after_sigkill_mid_epoch_matches_uninterrupted_run(tmp_path):
    """Kill a training process with SIGKILL mid-epoch, resume it, and get bit-identical weights."""
    done = _run_job(tmp_path / "full.pt", tmp_path / "full_out.pt")
    assert done.returncode == 0, done.stderr

    # 12 batches an epoch, a checkpoint every 5 iterations: killed after 23, the checkpoint is 20's, mid-epoch 2
    killed = _run_job(tmp_path / "cut.pt", tmp_path / "cut_out.pt", "--die-at", 23)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert killed.stdout.split()[-1] == "23", killed.stdout
    assert not (tmp_path / "cut_out.pt").exists()
    state = load_checkpoint(tmp_path / "cut.pt")
    assert (state["epoch"], state["batch_in_epoch"], state["iteration"]) == (1, 8, 20)

    resumed = _run_job(tmp_path / "cut.pt", tmp_path / "cut_out.pt", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.splitlines()[0] == "iteration 21"
    full = torch.load(tmp_path / "full_out.pt", weights_only=True)
    cut = torch.load(tmp_path / "cut_out.pt", weights_only=True)
    assert full["iterations"] == cut["iterations"] == 48
    for name, value in full["model"].items():
        assert torch.equal(value, cut["model"][name]), f"{name} differs after resume"


def test_train_step_repeats_one_full_step_on_a_fixed_batch():
    from helpers.step import train_step

    seed_everything(3)
    ds = _problem(64)
    model = _model()
    step = train_step(model, torch.optim.SGD(model.parameters(), lr=0.5), (ds.tensors[0], ds.tensors[1]), "cpu")
    first = step().item()
    for _ in range(30):
        last = step().item()
    assert last < 0.5 * first, (first, last)


def test_history_records_the_rate_each_step_used():
    ds = _problem(32)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (step + 1))
    hist = fit(model, DataLoader(ds, batch_size=8), epochs=1, optimizer=opt, scheduler=sched, scheduler_step="batch",
               progress=False)
    assert [r["lr"] for r in hist.iterations] == pytest.approx([1.0, 1 / 2, 1 / 3, 1 / 4])


def test_resume_loads_rng_states_on_the_cpu_whatever_the_device(tmp_path, monkeypatch):
    """On a GPU or a Mac, map_location=<training device> would move the saved RNG states there and
    torch.set_rng_state would raise a TypeError. Stand-in for a GPU on this CPU machine: a map_location derived from
    the training device (a torch.device) is replaced by the meta device, which reproduces that TypeError."""
    from helpers import training

    ds = _problem(32)
    path = tmp_path / "ck.pt"
    seed_everything(0)
    fit(_model(), DataLoader(ds, batch_size=8, shuffle=True), epochs=1, optimizer=torch.optim.SGD(_model().parameters(),
        lr=0.1), checkpoint=path, progress=False)
    real = training.load_checkpoint

    def training_device_is_a_gpu(p, map_location="cpu"):
        return real(p, map_location="meta" if isinstance(map_location, torch.device) else map_location)

    monkeypatch.setattr(training, "load_checkpoint", training_device_is_a_gpu)
    model = _model()
    hist = fit(model, DataLoader(ds, batch_size=8, shuffle=True), epochs=2,
               optimizer=torch.optim.SGD(model.parameters(), lr=0.1), checkpoint=path, resume=True, progress=False)
    assert [e["epoch"] for e in hist.epochs] == [1, 2]
    with pytest.raises(TypeError):  # what resuming did before: RNG states mapped off the CPU
        training.set_rng_state(training.load_checkpoint(path, map_location="meta")["rng"])


class _StepClock:
    """A clock that advances ``per_step`` seconds each time ``TimePace`` reads it, whatever this machine is doing:
    a limit then lands on the same step in every run (no test depends on where a wall-clock limit lands)."""

    def __init__(self, per_step):
        self.now, self.per_step = 0.0, per_step

    def __call__(self):
        self.now += self.per_step
        return self.now


def _pace_run(limit_s, epochs, schedule="onecycle", clock=None, monkeypatch=None):
    from helpers.schedules import make_scheduler
    from helpers.training import TimePace

    if clock is not None:
        monkeypatch.setattr(TimePace, "clock", staticmethod(clock))
    torch.manual_seed(0)
    x = torch.randn(1024, 16)
    loader = DataLoader(TensorDataset(x, x[:, :4].argmax(1)), batch_size=32, shuffle=True)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched, on = make_scheduler(schedule, opt, epochs=epochs, steps_per_epoch=len(loader), drop_period=None)
    history = fit(model, loader, epochs=epochs, optimizer=opt, scheduler=sched, scheduler_step=on, device="cpu",
                  progress=False, time_limit_s=limit_s)
    return history, model


def test_time_limit_stops_on_time_and_the_schedule_still_completes(monkeypatch):
    """A plan far longer than the limit allows (300 epochs of 32 steps): fit stops at the limit, mid-epoch, and
    OneCycle has run its whole course (peak reached, rate annealed to its end). Time is controlled: every read of
    the pace's clock is 1/64 s later (exact in binary), so the limit lands on the same step on any machine."""
    history, _ = _pace_run(1.25 + 2**-7, 300, clock=_StepClock(2**-6), monkeypatch=monkeypatch)
    # the pace's elapsed time after step k is (k + 1) / 64 s (its start and the FLOP count's pause read the clock too)
    assert len(history.iterations) == 80, "the first step whose elapsed time reaches the limit is the last"
    assert len(history.epochs) == 3 and history.epochs[-1]["partial"] is True
    assert [e.get("partial", False) for e in history.epochs[:2]] == [False, False]
    lrs = [i["lr"] for i in history.iterations]
    assert max(lrs) > 0.09, "the peak of the cycle was reached"
    assert lrs[-1] < 0.02 * max(lrs), "and the rate annealed to the end of the cycle"


def test_a_limit_on_an_epoch_boundary_ends_that_epoch_whole(monkeypatch):
    """The case that once made the test above a coin toss: the limit falls on the last step of an epoch. That
    epoch is complete (not partial), and no further epoch is started."""
    history, _ = _pace_run(1 + 2**-7, 300, clock=_StepClock(2**-6), monkeypatch=monkeypatch)
    assert len(history.iterations) == 64 and len(history.epochs) == 2
    assert not history.epochs[-1].get("partial")


@pytest.mark.parametrize("schedule", ["onecycle", "piecewise"])
def test_time_limit_changes_nothing_when_the_plan_fits(schedule, monkeypatch):
    """A loop faster than its budget trains exactly the planned steps with exactly the unbudgeted schedule."""
    paced, paced_model = _pace_run(600.0, 2, schedule, clock=_StepClock(2**-6), monkeypatch=monkeypatch)
    plain, plain_model = _pace_run(None, 2, schedule)
    assert [i["lr"] for i in paced.iterations] == [i["lr"] for i in plain.iterations]
    assert len(paced.epochs) == 2 and not paced.epochs[-1].get("partial")
    for a, b in zip(paced_model.parameters(), plain_model.parameters()):
        assert torch.equal(a, b)


def test_a_time_limit_of_zero_trains_one_step():
    """A budget already spent (make gpu-check's floors run: budget_s=1) takes one step, never divides by zero."""
    history, _ = _pace_run(0.0, 3)
    assert len(history.iterations) == 1 and history.epochs[-1]["partial"] is True


def test_time_spent_counting_flops_is_not_training_time(monkeypatch):
    """fit counts the first step's FLOPs on a copy; the pace leaves that time out of the budget."""
    from helpers import training

    clock, real = _StepClock(2**-6), training.count_step

    def slow_count(*args, **kwargs):
        clock.now += 100.0  # counting takes 100 s by the pace's clock
        return real(*args, **kwargs)

    monkeypatch.setattr(training, "count_step", slow_count)  # the name fit calls
    history, _ = _pace_run(5.0, 2, clock=clock, monkeypatch=monkeypatch)
    assert clock.now > 100, "the count ran"
    assert len(history.epochs) == 2 and not history.epochs[-1].get("partial"), "100 s of counting spent no budget"


def test_fit_records_model_flops_and_mfu_without_changing_the_training(monkeypatch):
    """The first step is counted on a copy (RNG kept): the epochs hold FLOPs per item (analytic: forward 2·in·out per
    Linear, backward twice that except the first layer's input gradient) and MFU against the cached peak."""
    from helpers import training

    peaks = {"flops_per_s": {"float32": 1e11}, "device": "cpu", "hardware": "test"}
    monkeypatch.setattr(training, "measured_ceilings", lambda device, measure=True: peaks)

    def run(count):
        torch.manual_seed(0)
        x, y = torch.randn(64, 8), torch.randint(0, 3, (64,))
        model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.3), nn.ReLU(), nn.Linear(16, 3))
        loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
        history = fit(model, loader, epochs=2, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), device="cpu",
                      progress=False, count_flops=count)
        return history, model

    counted, model = run(True)
    plain, same = run(False)
    forward = 2 * (8 * 16 + 16 * 3)
    assert counted.final["flops_per_item"] == forward + forward + 2 * 16 * 3
    assert counted.final["mfu"] == pytest.approx(counted.final["flops_per_s"] / 1e11)
    assert "mfu" not in plain.final and "flops_per_s" not in plain.final
    for a, b in zip(model.parameters(), same.parameters()):
        assert torch.equal(a, b), "counting must not change what is trained (dropout's RNG, the data order)"


def test_each_epoch_records_the_rate_it_trained_at():
    """A per-epoch schedule steps after the epoch: its record keeps the rate the epoch used, not the next one."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    hist = fit(model, DataLoader(_problem(16), batch_size=8), epochs=3, optimizer=opt, scheduler=sched,
               scheduler_step="epoch", progress=False)
    assert [e["lr"] for e in hist.epochs] == pytest.approx([1.0, 0.5, 0.25])
