"""Unit tests of helpers.schedules: the documented values of each schedule, the bug, the range test."""
import math

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from helpers import schedules


def test_piecewise_is_matlab_piecewise_per_epoch():
    curve = schedules.lr_curve("piecewise", lr=0.1, epochs=6, steps_per_epoch=3, drop_period=2, drop_factor=0.1)
    per_epoch = curve[::3]
    assert per_epoch == pytest.approx([0.1, 0.1, 0.01, 0.01, 0.001, 0.001])


def test_stepping_a_per_epoch_schedule_every_batch_is_the_classic_bug():
    right = schedules.lr_curve("piecewise", lr=0.1, epochs=4, steps_per_epoch=10, drop_period=2)
    wrong = schedules.lr_curve("piecewise", lr=0.1, epochs=4, steps_per_epoch=10, drop_period=2, step_on="batch")
    assert right[19] == pytest.approx(0.1) and wrong[19] < 1e-9  # decayed 9 times within two epochs


def test_cosine_matches_closed_form_and_the_blog_snippet_is_flat():
    curve = schedules.lr_curve("cosine", lr=0.1, epochs=10, steps_per_epoch=1)
    for e in range(10):
        assert curve[e] == pytest.approx(schedules.cosine_closed_form(e, base_lr=0.1, eta_min=0.0, epochs=10))
    flat = schedules.lr_curve("cosine", lr=0.001, epochs=10, steps_per_epoch=1, eta_min=0.001)
    assert max(flat) - min(flat) < 1e-12


def test_warmup_then_cosine_shape():
    curve = schedules.lr_curve("warmup_cosine", lr=0.4, epochs=5, steps_per_epoch=10, warmup_epochs=1)
    assert curve[0] == pytest.approx(0.04) and curve[10] == pytest.approx(0.4)  # full rate after 10 warm-up steps
    assert max(curve) == pytest.approx(0.4) and curve[-1] < 0.01
    assert all(a < b for a, b in zip(curve[:10], curve[1:11]))  # rising during warm-up
    with pytest.raises(ValueError, match="warm-up"):
        schedules.lr_curve("warmup_cosine", lr=0.1, epochs=1, steps_per_epoch=5, warmup_epochs=1)


def test_onecycle_peaks_at_the_optimizer_lr():
    curve = schedules.lr_curve("onecycle", lr=0.2, epochs=4, steps_per_epoch=25)
    assert len(curve) == 100 and max(curve) == pytest.approx(0.2, rel=1e-3)
    assert curve[0] == pytest.approx(0.2 / 25) and curve[-1] < 1e-4
    assert 20 <= curve.index(max(curve)) <= 40  # 30 % of the way in


def test_constant_and_unknown():
    assert set(schedules.lr_curve("constant", lr=0.05, epochs=3, steps_per_epoch=2)) == {0.05}
    with pytest.raises(ValueError, match="unknown schedule 'linear'"):
        schedules.lr_curve("linear", lr=0.1, epochs=1, steps_per_epoch=1)


def test_lr_range_test_rises_exponentially_and_stops_on_divergence():
    torch.manual_seed(0)
    x = torch.randn(256, 8)
    y = (x[:, 0] > 0).long()
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    out = schedules.lr_range_test(model, DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True), start=1e-4,
                                  end=100.0, steps=60)
    lrs = out["lr"]
    assert lrs[0] == pytest.approx(1e-4)
    ratios = [b / a for a, b in zip(lrs, lrs[1:])]
    assert max(ratios) == pytest.approx(min(ratios))
    assert len(lrs) < 60, "a learning rate of 100 must make the loss blow up and stop the test early"
    assert len(out["loss"]) == len(out["smoothed"]) == len(lrs)
    assert math.isfinite(min(out["smoothed"]))
