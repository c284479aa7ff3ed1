"""DDP on CPU with gloo: equivalence with one big batch, failures, bad world sizes (two nodes on localhost equal one
process: lesson 05 section 5 asserts it, run by nbval)."""
import time
from pathlib import Path

import pytest
import torch

from helpers.launcher import check_world_size, launch

COMMON = ["--synthetic", "256", "--widths", "8,16,16", "--depth", "1", "--no-bn", "--no-augment", "--epochs", "2",
          "--schedule", "piecewise", "--drop-period", "1", "--drop-factor", "0.5"]


def _params(path):
    return torch.load(path, weights_only=True)


def _max_diff(a, b):
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """One plain process, batch 32, run in this process as lesson 05 runs it (no torchrun: 7 s less a run here);
    no torchrun variables reach it, and the random streams it seeds are given back afterwards."""
    from helpers.distributed import main
    from helpers.training import rng_state, set_rng_state

    out = tmp_path_factory.mktemp("single") / "p.pt"
    saved = rng_state()
    with pytest.MonkeyPatch.context() as mp:
        for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
            mp.delenv(name, raising=False)
        try:
            main([str(a) for a in COMMON + ["--batch-size", "32", "--params-out", out]])
        finally:
            set_rng_state(saved)
    return _params(out)


def test_two_ranks_equal_one_process_with_double_batch(single, tmp_path):
    """2 ranks x batch 16 all-reduce to the same gradients as 1 process x batch 32 (no batch norm)."""
    launch(2, COMMON + ["--batch-size", "16", "--params-out", tmp_path / "p.pt"], timeout=240, echo=False)
    diff = _max_diff(single, _params(tmp_path / "p.pt"))
    assert diff <= 1e-6, f"max abs parameter difference {diff:.3g}"
    moved = max((single[k] - v).abs().max().item() for k, v in _initial_params().items())
    assert moved > 1e-3, "the parameters must have trained, or the comparison proves nothing"


def _initial_params():
    from helpers.models import ConvBlockNet

    torch.manual_seed(0)
    return ConvBlockNet((8, 16, 16), 1, batch_norm=False).state_dict()


def _alive_with(marker: str) -> list:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if marker in (proc / "cmdline").read_bytes().decode(errors="ignore"):
                    found.append(proc.name)
            except OSError:
                pass
    return found


def test_a_failing_rank_fails_the_launch_quickly_and_leaves_no_process(tmp_path):
    """Quickly: the rank's own error (RuntimeError), not the launch's time limit (TimeoutError), which a launch that
    waited for the other rank's collective to time out (30 min for gloo) would reach first."""
    marker = str(tmp_path / "never.json")
    with pytest.raises(RuntimeError) as err:
        launch(2, ["--synthetic", "2048", "--widths", "8,8,8", "--depth", "1", "--batch-size", "16", "--epochs", "5",
                   "--fail-at-step", "3", "--fail-rank", "1", "--out", marker], timeout=240, echo=False)
    assert "injected failure on rank 1 at step 3" in str(err.value)
    time.sleep(0.5)
    assert _alive_with(marker) == []
    assert not Path(marker).exists()


def test_timeout_stops_every_process(tmp_path):
    marker = str(tmp_path / "slow.json")
    with pytest.raises(TimeoutError, match="longer than 8 s"):
        launch(1, ["--synthetic", "4096", "--epochs", "50", "--out", marker], timeout=8, echo=False)
    time.sleep(0.5)
    assert _alive_with(marker) == []


def test_more_gpu_workers_than_gpus_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"asked for 2 GPU worker\(s\) but this machine has 0 GPU\(s\).*device='cpu'"):
        launch(2, ["--synthetic", "64"], device="cuda")
    with pytest.raises(ValueError, match="at least 1"):
        check_world_size(0, "cpu")
    check_world_size(4, "cpu")  # CPU processes: as many as you like


def test_first_error_finds_the_cause_not_the_consequences():
    from helpers.launcher import _first_error

    log = ["world size 2", "[rank1]: Traceback (most recent call last):", "[rank1]: ValueError: bad batch",
           "[rank0]: RuntimeError: Connection closed by peer", "torch.distributed.elastic...ChildFailedError: "]
    assert _first_error(log) == "First error: ValueError: bad batch\n"
    assert _first_error(["[rank1]: terminate called after throwing an instance of 'gloo::IoException'"]).startswith(
        "First error: terminate called")
    assert _first_error(["epoch 1: fine", "done"]) == ""


def test_local_nodes_on_gpus_get_their_own_devices(monkeypatch):
    """Two simulated nodes must not share a GPU (NCCL refuses two ranks on one device): each gets a slice."""
    from helpers import launcher

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    started = {}
    monkeypatch.setattr(launcher, "_run", lambda cmds, **kw: started.update(cmds=cmds, **kw))
    launcher.launch_local_nodes(2, 2, ["--synthetic", "64"], device="cuda")
    assert [e["CUDA_VISIBLE_DEVICES"] for e in started["envs"]] == ["0,1", "2,3"]
    assert all("--device" in c and "cuda" in c for c in started["cmds"])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7,9")
    assert launcher.gpu_slices(3, 1) == [["5"], ["7"], ["9"]]
    with pytest.raises(ValueError, match="2 nodes × 2 GPU processes need 4 GPUs but this machine has 3"):
        launcher.launch_local_nodes(2, 2, ["--synthetic", "64"], device="cuda")


def test_cpu_nodes_leave_gpu_visibility_alone(monkeypatch):
    from helpers import launcher

    started = {}
    monkeypatch.setattr(launcher, "_run", lambda cmds, **kw: started.update(cmds=cmds, **kw))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    launcher.launch_local_nodes(2, 1, ["--synthetic", "64"], device="cpu")
    assert [e["CUDA_VISIBLE_DEVICES"] for e in started["envs"]] == ["3", "3"]


@pytest.mark.parametrize("loader", ["device", "dataloader"])
def test_every_rank_draws_different_augmentation(loader):
    """Ranks must not augment alike (they did: every rank re-seeded the same stream right after the weights)."""
    from helpers import distributed

    args = distributed._parse(["--synthetic", "64", "--widths", "8,8,8", "--depth", "1", "--batch-size", "8",
                               "--loader", loader, "--no-shuffle", "--no-val"])
    ones = []
    for rank in (0, 1):
        me = distributed.Rank(rank, 0, 2, torch.device("cpu"), "gloo", use_pg=False)
        run = distributed.setup(args, me)
        run.train_set.images[:] = run.train_set.images[0]  # every image the same: only augmentation differs
        ones.append(next(iter(run.loader))[0])
    assert not torch.equal(ones[0], ones[1])
    assert run.speeds == {}, "only rank 0 measures the throughputs"


def test_budget_chooses_epochs_from_the_measured_speed(capsys):
    from helpers import distributed

    args = distributed._parse(["--synthetic", "64", "--budget-min", "10", "--val-limit", "3000"])
    me = distributed.Rank(0, 0, 2, torch.device("cpu"), "gloo", use_pg=False)
    # 50,000 images over 2 ranks at 1,000 images/s: 25 s of steps + 5 s making the batches at 5,000 images/s
    # + 1 s validating 3,000 images per epoch
    speeds = {"model_images_per_s": 1000.0, "input_images_per_s": 5000.0}
    assert distributed._budget_epochs(args, me, speeds, 50000, 1.0) == int(600 * 0.92 / 31) == 17
    assert "about 31.0 s per epoch (1.0 s of it validation) → 17 epochs planned" in capsys.readouterr().out
    args.loader, args.workers = "dataloader", 4  # worker processes make the batches while the model steps
    assert distributed._budget_epochs(args, me, {**speeds, "input_images_per_s": 500.0}, 50000, 1.0) == int(552 / 51)
    assert distributed._budget_epochs(args, me, speeds, 50000, 1.0) == int(552 / 26)
    args.loader = "device"  # a one-batch loader measures no input speed: the steps alone
    assert distributed._budget_epochs(args, me, {**speeds, "input_images_per_s": 0.0}, 50000, 1.0) == int(552 / 26)
    args.budget_min = 0
    assert distributed._budget_epochs(args, me, {}, 50000) == args.epochs


def test_budget_run_end_to_end(tmp_path):
    """A budgeted run measures its speed, picks its epochs, trains them within the budget, and records both
    throughputs. That fit stops at its time limit is checked on a controlled clock (test_training's pace tests); here,
    that the run hands fit its budget as that limit: no assertion on where a wall clock lands."""
    import json
    import math

    out = tmp_path / "r.json"
    launch(1, ["--synthetic", "200", "--widths", "8,8,8", "--depth", "1", "--batch-size", "50", "--budget-min", "0.1",
               "--schedule", "piecewise", "--drop-period", "0", "--out", out], torchrun=False, echo=False, timeout=240)
    rec = json.loads(out.read_text())
    assert rec["epochs"] > 0 and len(rec["history"]["epochs"]) == math.ceil(rec["epochs"]) <= rec["planned_epochs"]
    assert rec["time_limit_s"] == pytest.approx(6.0) and rec["train_wall_s"] > 0, "fit gets the 6-s budget as its limit"
    assert rec["validation_s"] > 0, "the plan timed a validation pass"
    assert rec["input_images_per_s"] > 0 and rec["model_images_per_s"] > 0 and "input_bound" in rec
    epochs, done = rec["history"]["epochs"], [0] + [e["iteration"] for e in rec["history"]["epochs"]]
    rates = [50 * (done[k + 1] - done[k]) / e["seconds"] for k, e in enumerate(epochs)]  # images actually seen
    assert rec["flops_per_s"] / rec["flops_per_item"] == pytest.approx(max(rates), rel=0.01), \
        "model FLOP/s from the images each epoch saw (a time-limited last epoch saw fewer than train_images)"


def test_compact_recipe_runs_end_to_end_with_test_time_flips(tmp_path):
    """--model compact: whitened first layer frozen (not in the optimizer), Nesterov, both test accuracies recorded."""
    import json

    out, params = tmp_path / "c.json", tmp_path / "c.pt"
    launch(1, ["--synthetic", "200", "--model", "compact", "--widths", "8,8,8", "--batch-size", "50", "--epochs", "2",
               "--schedule", "onecycle", "--nesterov", "--crop-padding", "2", "--tta", "--label-smoothing", "0.2",
               "--weight-decay", "5e-4", "--out", out, "--params-out", params], torchrun=False, echo=False, timeout=240)
    rec = json.loads(out.read_text())
    assert 0 <= rec["test_accuracy"] <= 1 and 0 <= rec["test_accuracy_no_tta"] <= 1
    from helpers.cifar10 import normalize, synthetic_images
    from helpers.models import CompactNet

    expected = CompactNet((8, 8, 8)).init_whitening(normalize(synthetic_images(200).images[:5000]))
    assert torch.equal(_params(params)["whiten.weight"], expected.whiten.weight)  # frozen: never stepped


def test_optimizer_decays_weights_but_not_biases_or_norms():
    from helpers import distributed
    from helpers.models import CompactNet

    args = distributed._parse(["--synthetic", "8", "--weight-decay", "5e-4", "--nesterov"])
    me = distributed.Rank(0, 0, 1, torch.device("cpu"), "gloo", use_pg=False)
    net = CompactNet((8, 8, 8)).init_whitening(torch.randn(4, 3, 32, 32))
    opt, _, _ = distributed._optimizer(args, me, net, steps_per_epoch=10)
    decayed, plain = opt.param_groups
    assert decayed["weight_decay"] == 5e-4 and plain["weight_decay"] == 0 and decayed["nesterov"]
    assert all(p.ndim > 1 for p in decayed["params"]) and all(p.ndim == 1 for p in plain["params"])
    ids = {id(p) for g in opt.param_groups for p in g["params"]}
    assert id(net.whiten.weight) not in ids and id(net.whiten.bias) in ids
