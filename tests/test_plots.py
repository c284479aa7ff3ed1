"""helpers.plots: every function draws into axes it is given (figures compose) and returns them."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from helpers import plots  # noqa: E402
from helpers.training import History  # noqa: E402


def _history():
    h = History()
    h.iterations = [{"iteration": i, "epoch": 0, "loss": 1 / i, "lr": 0.1} for i in range(1, 5)]
    h.epochs = [{"epoch": 1, "iteration": 4, "train_loss": 0.5, "train_accuracy": 0.7, "seconds": 1.0, "lr": 0.1,
                 "val_accuracy": 0.6}]
    h.validation = [{"iteration": 4, "epoch": 0, "loss": 0.6, "accuracy": 0.6}]
    return h


def test_plots_draw_into_given_axes():
    fig, axes = plt.subplots(3, 4, figsize=(12, 8))
    a = axes.flat
    calls = [
        lambda ax: plots.compare_bars({"cpu": 2.0, "gpu": 1.0}, unit="ms", title="t", baseline="cpu",
                                      references={"ref": {"cpu": 1.5}}, ax=ax),
        lambda ax: plots.compare_lines({"cpu": {1: 1.0, 4: 2.0}}, xlabel="x", ylabel="y", title="t",
                                       references={"ref": {"gpu": {1: 3.0, 4: 9.0}}}, ax=ax),
        lambda ax: plots.scaling({"1": 1.0, "2": 1.8}, label="cpu", title="t", references={"r": {"gpu": {"4": 3.5}}},
                                 ax=ax),
        lambda ax: plots.confusion_matrix(torch.tensor([[3, 1], [0, 4]]), ["a", "b"], title="t", ax=ax),
        lambda ax: plots.phase_bar({"load (CPU)": 2.0, "forward": 1.0}, title="t", ax=ax),
        lambda ax: plots.lr_curves({"cosine": [0.1, 0.05, 0.0]}, steps_per_epoch=1, logy=True, ax=ax),
        lambda ax: plots.float_formats(ax=ax),
        lambda ax: plots.ddp_diagram(ax=ax),
    ]
    for call, ax in zip(calls, a):
        assert call(ax) is ax
        assert ax.get_children() and (ax.lines or ax.patches or ax.images), "nothing was drawn"
    pair = (axes[2, 0], axes[2, 1])
    assert plots.training_progress(_history(), ax=pair) is pair and pair[1].lines
    pair = (axes[2, 2], axes[2, 3])
    assert plots.recipe_histories({"run": _history().state_dict()}, ax=pair) is pair and pair[0].lines
    timed_fig, timed = plt.subplots(1, 2)
    two = _history()
    two.epochs = [dict(two.epochs[0], epoch=1, seconds=90.0), dict(two.epochs[0], epoch=2, seconds=30.0)]
    plots.recipe_histories({"run": two.state_dict()}, minutes=True, ax=timed)
    assert list(timed[0].lines[0].get_xdata()) == [1.5, 2.0]  # minutes spent at each epoch's end
    assert timed[0].get_xlabel() == "minutes of training"
    plt.close(timed_fig)
    assert all(ax.figure is fig for ax in axes.flat)
    plt.close(fig)


def test_image_grid_and_new_figures():
    imgs = torch.randint(0, 255, (3, 3, 8, 8), dtype=torch.uint8)
    grid = plots.image_grid(imgs, ["a", "b", "c"], ncols=2, title="three")
    flat = list(grid.flat)
    assert len(flat) == 4 and [ax.get_title() for ax in flat[:3]] == ["a", "b", "c"] and not flat[3].images
    ax = plots.compare_bars({"x": 1.0}, unit="s", title="new")
    assert ax.figure is not None and ax.get_title() == "new"
    plt.close("all")
