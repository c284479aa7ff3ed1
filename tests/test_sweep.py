"""helpers.sweep: trials in parallel processes give the same results as one after another."""
import pytest

from helpers.sweep import run_sweep, train_vowels


def test_parallel_sweep_matches_sequential_and_keeps_order():
    configs = [{"hidden": 8, "lr": 0.01, "epochs": 2}, {"hidden": 16, "lr": 0.02, "epochs": 2, "bidirectional": False}]
    sequential, _ = run_sweep(train_vowels, configs, processes=1)
    parallel, seconds = run_sweep(train_vowels, configs, processes=2)
    assert [r["config"] for r in parallel] == configs
    assert [r["accuracy"] for r in parallel] == [r["accuracy"] for r in sequential]  # same seed, one thread each
    assert all(0.0 < r["accuracy"] <= 1.0 and r["seconds"] > 0 for r in parallel) and seconds > 0


def test_sweep_rejects_zero_processes():
    with pytest.raises(ValueError, match="at least 1"):
        run_sweep(train_vowels, [], processes=0)
