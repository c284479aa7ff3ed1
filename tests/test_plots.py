"""helpers.plots: every function draws into axes it is given (figures compose) and returns them."""
import matplotlib
import pytest

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


# ------------------------------------------------------------------ what a reader sees: no text over other text

LONG = ["host clock, no sync (wrong)", "host clock + synchronise", "torch.utils.benchmark"]  # lesson 02's clocks


def drawn_texts(fig) -> list:
    """(text, extent in pixels) of every piece of text the renderer actually draws (hidden or clipped: left out)."""
    from unittest import mock

    from matplotlib.text import Text

    drawn, original = {}, Text.draw

    def record(self, renderer):
        if self.get_visible() and self.get_text().strip():
            drawn[id(self)] = self
        return original(self, renderer)

    with mock.patch.object(Text, "draw", record):
        fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    return [(t.get_text(), t.get_window_extent(renderer)) for t in drawn.values()]


def overlapping_texts(fig, tolerance_px: float = 1.0) -> list:
    """Pairs of drawn texts whose rendered extents overlap by more than ``tolerance_px`` both ways."""
    texts = drawn_texts(fig)
    pairs = []
    for i, (a, box_a) in enumerate(texts):
        for b, box_b in texts[i + 1:]:
            dx = min(box_a.x1, box_b.x1) - max(box_a.x0, box_b.x0)
            dy = min(box_a.y1, box_b.y1) - max(box_a.y0, box_b.y0)
            if dx > tolerance_px and dy > tolerance_px:
                pairs.append((a, b))
    return pairs


def _long_history(epochs: int = 8):
    h = _history()
    h.iterations = [{"iteration": i, "epoch": i // 50, "loss": 2 / i ** 0.3, "lr": 0.1} for i in range(1, 400)]
    h.epochs = [{"epoch": e, "iteration": 50 * e, "train_loss": 1 / e, "train_accuracy": 1 - 0.5 / e, "lr": 0.1 / e,
                 "seconds": 30.0, "val_accuracy": 1 - 0.6 / e} for e in range(1, epochs + 1)]
    h.validation = [{"iteration": 50 * e, "epoch": e, "loss": 1.2 / e, "accuracy": 1 - 0.6 / e}
                    for e in range(1, epochs + 1)]
    return h


def _small(ncols: int = 1, size=(4.5, 3.0)):
    return plt.subplots(1, ncols, figsize=size, layout="constrained")[1]


def _two_bar_charts():
    _, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2))
    plots.compare_bars({"eager (8 kernels)": 41.5, "compiled (fused)": 6.24}, unit="ms", title="Time of the chain",
                       baseline="eager (8 kernels)", ax=left)
    return plots.compare_bars({"eager": 72.0, "compiled": 8.0}, unit="MiB moved", title="Bytes it must move", ax=right)


def _stacked_phases(runs: int):
    bars = {f"this machine, run {k} (trace)": dict(list(PHASES.items())[:6]) for k in range(runs)}
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 2.4 + 1.0 * runs))
    plots.phase_stack(bars, title="One training step, batch 32, cpu — cpu-intel-xeon-processor-2t", ax=top)
    return plots.phase_stack(bars, title="the same steps as shares of their length", share=True, ax=bottom)


def _lines(names, n: int = 8):
    return {name: {2 ** k: (k + 1) * (i + 1) for k in range(n)} for i, name in enumerate(names)}


NAMES = [f"{clock}, variant {k}" for k in range(2) for clock in LONG]
PREDICTED_GPUS = ("T4", "A100 80GB SXM", "H100 SXM")
CLASSES = [f"class number {k} (long name)" for k in range(12)]
PHASES = {f"phase {k}: {what}": ms for k, (what, ms) in enumerate(
    [("data wait (CPU)", 3.0), ("host→device copy", 0.4), ("forward pass", 6.0), ("backward pass", 11.0),
     ("optimizer step", 0.3), ("logging (CPU)", 0.2), ("zero_grad", 0.1), ("synchronise", 1.5)])}

FIGURES = {  # every public plots function, with long labels, many items and small figures
    "compare_bars": [
        lambda: plots.compare_bars(dict(zip(LONG, [0.05, 2.1, 2.05])), unit="ms", baseline=LONG[1],
                                   title="What each clock reports for the same GPU matmul"),
        lambda: plots.compare_bars(dict(zip(LONG, [0.05, 2.1, 2.05])), unit="ms", baseline=LONG[1],
                                   title="What each clock reports for the same GPU matmul", ax=_small()),
        lambda: plots.compare_bars({f"{n} ({k})": 10.0 + k for k, n in enumerate(NAMES * 2)}, unit="images/s",
                                   baseline=f"{NAMES[0]} (0)", lower_is_better=False, title="Twelve bars",
                                   references={"NVIDIA H100 80GB HBM3": {NAMES[0]: 900.0, NAMES[1]: 1300.0}}),
        lambda: _two_bar_charts(),  # lesson 08: two charts side by side in a figure the notebook made
        lambda: plots.compare_bars({"fp32": 40.0, "bf16 autocast": 25.0}, unit="ms/step", baseline="fp32",
                                   title="Step time per precision", predictions={
                                       gpu: {"fp32": 2.0, "bf16 autocast": 1.0} for gpu in PREDICTED_GPUS}),
    ],
    "compare_lines": [lambda: plots.compare_lines(_lines(NAMES), xlabel="batch size", ylabel="items/s", title="Lines",
                                                  references={"NVIDIA A100-SXM4-80GB": _lines(NAMES[:3])},
                                                  ax=_small(size=(6, 3.5))),
                      lambda: plots.compare_lines(_lines(NAMES[:1]), xlabel="batch size", ylabel="items/s",
                                                  title="Lines", predictions=_lines(PREDICTED_GPUS), logy=True)],
    "scaling": [lambda: plots.scaling({1: 1.0, 2: 1.7, 4: 2.9}, label="CPU processes (gloo) on this machine",
                                      title="Speed-up", references={"8× H100": _lines(NAMES[:2], 4)}),
                lambda: plots.scaling({1: 1.0, 2: 1.7}, label="CPU processes", title="Speed-up",
                                      predictions={gpu: {1: 1.0, 8: 7.5} for gpu in PREDICTED_GPUS})],
    "confusion_matrix": [lambda: plots.confusion_matrix(torch.randint(0, 1000, (12, 12)), CLASSES, title="Twelve",
                                                        xlabel="predicted class (of twelve)")],
    "phase_bar": [lambda: plots.phase_bar(PHASES, title="One training step split into its phases, on this CPU"),
                  lambda: plots.phase_bar(PHASES, title="Small", ax=_small(size=(6, 2)))],
    "image_grid": [lambda: plots.image_grid(torch.randint(0, 255, (12, 3, 8, 8), dtype=torch.uint8),
                                            [f"{c}: predicted {c}" for c in CLASSES], ncols=6, title="Grid")],
    "lr_curves": [lambda: plots.lr_curves({f"schedule {n}": [0.1 / (i + 1 + k) for i in range(60)]
                                           for k, n in enumerate(NAMES)}, steps_per_epoch=10, logy=True,
                                          title="Learning-rate schedules, one line each", ax=_small(size=(6, 3)))],
    "recipe_histories": [lambda: plots.recipe_histories({n: _long_history().state_dict() for n in NAMES[:4]},
                                                        title="Four recipes compared", minutes=True)],
    "training_progress": [lambda: plots.training_progress(_long_history(), title="A long training-progress title "
                                                                                  "that names model, data and mode")],
    "float_formats": [lambda: plots.float_formats(), lambda: plots.float_formats(ax=_small(size=(6, 3)))],
    "ddp_diagram": [lambda: plots.ddp_diagram(ranks=3), lambda: plots.ddp_diagram(ranks=8)],
    "roofline": [lambda: plots.roofline({f"{n}: fp32": {"intensity": 2.0 ** k, "gflops": 10.0 * 2 ** k}
                                         for k, n in enumerate(NAMES)}, peak_gflops=2000.0, peak_gbps=40.0,
                                        title="Roofline", references={"NVIDIA H100 (dense bf16)": (989e3, 3350.0)}),
                 lambda: plots.roofline({"matmul": {"intensity": 300.0, "gflops": 300.0}}, peak_gflops=350.0,
                                        peak_gbps=26.0, title="Roofline with datasheet GPUs",
                                        datasheet={g: (8e3 * (k + 1), 300.0 * (k + 1)) for k, g in
                                                   enumerate(PREDICTED_GPUS)})],
    "phase_stack": [lambda: plots.phase_stack({f"reference: {n}": dict(PHASES) for n in NAMES}, share=True,
                                              title="Where each step goes"),
                    lambda: _stacked_phases(2)],  # lesson 09: two short panels, one above the other
    "memory_search": [lambda: plots.memory_search({b: (None if b > 700 else 20.0 + b) for b in
                                                   [64, 128, 256, 512, 1024, 768, 640, 704, 736, 720]},
                                                  limit_mb=740.0, title="Out-of-memory search")],
}


def test_every_plot_function_is_checked_for_overlapping_text():
    public = {name for name, f in vars(plots).items()
              if callable(f) and not name.startswith("_") and getattr(f, "__module__", "") == plots.__name__}
    assert public == set(FIGURES), f"add these to FIGURES: {public - set(FIGURES)}"


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_no_text_overlaps_other_text(name):
    for k, draw in enumerate(FIGURES[name]):
        ax = draw()
        fig = (ax if not hasattr(ax, "__len__") and not hasattr(ax, "flat") else next(iter(
            ax.flat if hasattr(ax, "flat") else ax))).figure
        pairs = overlapping_texts(fig)
        plt.close(fig)
        assert pairs == [], f"plots.{name} (case {k}): these texts overlap: {pairs[:6]}"


def test_the_overlap_check_can_fail():
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.set_xticks(range(3), LONG)  # three long labels under a narrow axes run into each other
    assert overlapping_texts(fig), "the check missed tick labels that overlap"
    ax.set_xticks(range(3), ["a", "b", "c"])
    ax.text(0.5, 0.5, "one", transform=ax.transAxes)
    assert overlapping_texts(fig) == []
    ax.text(0.5, 0.5, "two", transform=ax.transAxes)
    assert overlapping_texts(fig) == [("one", "two")] or overlapping_texts(fig) == [("two", "one")]
    plt.close(fig)


def test_a_predicted_series_says_so_where_it_is_drawn():
    """Each predicted line's legend entry, and each predicted bar's label, says it was predicted, not measured."""
    ax = plots.compare_lines(_lines(["cpu"]), xlabel="batch", ylabel="items/s", title="t",
                             predictions=_lines(PREDICTED_GPUS))
    legend = [t.get_text().replace("\n", " ") for t in ax.get_legend().get_texts()]
    assert sum("predicted from the datasheet, not measured" in s for s in legend) == len(PREDICTED_GPUS), legend
    assert not any("predicted" in s for s in legend if s.startswith("this machine")), legend
    plt.close("all")
    same = {gpu: {1: 10.0, 8: 80.0} for gpu in PREDICTED_GPUS}  # host-bound: every GPU predicted alike
    ax = plots.compare_lines(_lines(["cpu"]), xlabel="batch", ylabel="items/s", title="t",
                             predictions={**same, "L4": {1: 5.0, 8: 80.0}})
    legend = [t.get_text().replace("\n", " ") for t in ax.get_legend().get_texts()]
    assert len(ax.get_lines()) == 3, "the coinciding predictions are one line"
    assert any(all(gpu in s for gpu in PREDICTED_GPUS) and "predicted" in s for s in legend), legend
    assert any(s.startswith("L4: predicted") for s in legend), legend
    ax = plots.compare_bars({"fp32": 4.0}, unit="ms", title="t", predictions={"T4": {"fp32": 1.0}})
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert ticks[0] == "fp32" and "predicted" in ticks[1] and "T4" in ticks[1]
    assert "predicted from the datasheet, not measured" in ax.get_xlabel().replace("\n", " ")
    plt.close("all")


def test_compare_bars_names_the_direction_from_the_unit_and_writes_thousands_plainly():
    ax = plots.compare_bars({"a": 14_823.0, "b": 4_640.0}, unit="tokens/s", title="rate")
    assert ax.get_ylabel() == "tokens/s (higher is better)"
    texts = [t.get_text() for t in ax.texts]
    assert any("14,823" in t for t in texts) and not any("e+" in t for t in texts), texts
    ax = plots.compare_bars({"a": 4836.2, "b": 0.5}, unit="ms/step", title="time")
    assert ax.get_ylabel() == "ms/step (lower is better)"
    ax = plots.compare_bars({"a": 2.0}, unit="images/s", title="told", lower_is_better=True)
    assert ax.get_ylabel() == "images/s (lower is better)"
    plt.close("all")


def texts_over_markers(fig, tolerance_px: float = 1.0) -> list:
    """(text, marker centre) where a drawn text covers a marker some line draws: the reader loses the point."""
    texts, pairs = drawn_texts(fig), []
    for ax in fig.axes:
        for line in ax.get_lines():
            if line.get_marker() in (None, "None", "", " "):
                continue
            half = line.get_markersize() * fig.dpi / 72 / 2
            for x, y in ax.transData.transform(line.get_xydata()):
                for text, box in texts:
                    if min(box.x1, x + half) - max(box.x0, x - half) > tolerance_px and \
                            min(box.y1, y + half) - max(box.y0, y - half) > tolerance_px:
                        pairs.append((text, (round(x), round(y))))
    return pairs


LESSON_09_TRIALS = {8: 5.6, 16: 11.2, 32: 21.5, 64: None, 48: 32.0, 56: 37.2, 60: 39.8, 62: None, 61: None}


@pytest.mark.parametrize("trials", [LESSON_09_TRIALS, {b: (None if b > 700 else 20.0 + b) for b in
                                                       [64, 128, 256, 512, 1024, 768, 640, 704, 736, 720, 712, 716]}])
def test_memory_search_numbers_cover_neither_each_other_nor_the_points(trials):
    limit = 40.0 if trials is LESSON_09_TRIALS else 740.0
    ax = plots.memory_search(trials, limit_mb=limit, title="Searching the largest batch under the limit")
    assert overlapping_texts(ax.figure) == [] and texts_over_markers(ax.figure) == []
    plt.close("all")


def test_the_marker_check_can_fail():
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([1, 2], [1, 2], "o", ms=10)
    ax.annotate("1", (1, 1), ha="center", va="center")
    fig.canvas.draw()  # the limits are final once drawn
    x, y = ax.transData.transform((1, 1))
    assert texts_over_markers(fig) == [("1", (round(x), round(y)))]  # the first point's marker, not the second's
    plt.close(fig)


def test_phase_bar_keeps_orange_for_the_host_phases():
    names = ["load + augment (CPU)", "copy to device", "forward (device)", "backward (device)", "optimizer (device)",
             "log loss (CPU)"]
    ax = plots.phase_bar(dict(zip(names, [19.0, 0.1, 41.0, 45.0, 0.5, 0.1])), title="One training step")
    colours = [tuple(p.get_facecolor()) for p in ax.patches]
    host = [c for n, c in zip(names, colours) if "(CPU)" in n]
    device = [c for n, c in zip(names, colours) if "(CPU)" not in n]
    assert len(set(host)) == 1 and host[0] not in device and len(set(device)) == len(device), colours
    hatches = [p.get_hatch() for n, p in zip(names, ax.patches) if "(CPU)" in n]
    assert len(set(hatches)) == len(hatches), f"two host phases look alike: {hatches}"  # 04's legend could not tell
    plt.close("all")


def _tick_values(axis) -> list:
    low, high = axis.get_view_interval()
    return [t for t in axis.get_majorticklocs() if low - 1e-9 <= t <= high + 1e-9]


def test_counts_tick_at_whole_numbers_only():
    """Threads (02), workers (05) and epochs (07) are counted: an axis of them never ticks at 1.25."""
    axes = [plots.scaling({1: 1.0, 2: 1.7}, label="CPU processes", title="Speed-up").xaxis,
            plots.compare_lines({"matmul": {1: 1.0, 2: 1.9}}, xlabel="CPU threads", ylabel="×", title="Threads",
                                logx=False).xaxis]
    h = _long_history(epochs=3).state_dict()
    axes += [a.xaxis for a in plots.recipe_histories({"a": h, "b": h}, title="Three epochs")]
    for axis in axes:
        ticks = _tick_values(axis)
        assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks), ticks
    fractional = plots.compare_lines({"x": {0.5: 1.0, 1.5: 2.0}}, xlabel="s", ylabel="y", title="t", logx=False)
    assert not all(float(t).is_integer() for t in _tick_values(fractional.xaxis))  # measured x values keep theirs
    plt.close("all")


def test_a_figure_title_is_as_large_as_an_axes_title_and_fits_the_figure():
    h = _long_history(epochs=3).state_dict()
    axes = plots.recipe_histories({"a": h}, title="1000 training images (image folder build/cifar10-jpg/CIFAR-10-"
                                                  "images/train), 3 epochs, ConvBlockNet — cpu-intel-xeon-processor-2t")
    fig = axes[0].figure
    title = fig._suptitle
    assert title.get_fontsize() >= axes[0].title.get_fontsize()
    fig.canvas.draw()
    box = title.get_window_extent(fig.canvas.get_renderer())
    assert box.x0 >= 0 and box.x1 <= fig.bbox.width, (box, fig.bbox.width)
    plt.close("all")


def test_neighbouring_bar_numbers_keep_a_gap():
    """Lesson 11's attention chart: six bars whose numbers all but touched ("0.758 peak MB1 peak MB")."""
    values = {"hand-written\nT=64": 0.758, "math\nT=64": 1.0, "flash_attention\nT=64": 0.66,
              "hand-written\nT=256": 12.1, "math\nT=256": 13.0, "flash_attention\nT=256": 2.77}
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 3.8))  # as lesson 11 draws it
    plots.compare_bars(values, unit="ms", title="Causal attention, cpu", ax=left)
    ax = plots.compare_bars(values, unit="peak MB", title="Causal attention, cpu", ax=right)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = sorted((t.get_window_extent(renderer) for t in ax.texts if t.get_visible()), key=lambda b: b.x0)
    gaps = [b.x0 - a.x1 for a, b in zip(boxes, boxes[1:]) if min(a.y1, b.y1) > max(a.y0, b.y0)]
    assert gaps and all(g >= 9 for g in gaps), gaps  # a character and a half at 100 dpi
    plt.close("all")


def test_titles_break_at_spaces_never_inside_a_machine_name():
    ax = plots.compare_bars({"a": 1.0, "b": 2.0}, unit="ms", title="Timing one 256×256 matmul on cpu — "
                                                                  "cpu-intel-xeon-processor-2t", ax=_small(size=(6, 3)))
    lines = ax.get_title().split("\n")  # lesson 02 showed "… on cpu — cpu-intel-xeon-" / "processor-2t"
    assert len(lines) > 1 and "cpu-intel-xeon-processor-2t" in lines[-1], lines
    plt.close("all")


def test_float_formats_draws_each_format_over_its_whole_normal_range():
    """Lesson 06's figure cut fp32 and bf16 at 1e-10, against the smallest normal its own table printed (1.2e-38)."""
    ax = plots.float_formats()
    for line, dtype in zip(ax.get_lines(), (torch.float32, torch.float16, torch.bfloat16)):
        f, xs = torch.finfo(dtype), line.get_xdata()
        assert f.smallest_normal <= min(xs) <= 1.2 * f.smallest_normal and f.max / 1.2 <= max(xs) <= f.max, dtype
    plt.close("all")


def test_labels_keep_a_word_with_its_number():
    assert plots._wrap("CompactNet, batch 32", 12) == "CompactNet,\nbatch 32"  # lesson 08 showed "batch" / "32"
    assert plots._wrap("peak 14.6 MB of 20", 8) == "peak\n14.6 MB\nof 20"  # "peak 14.6 MB" is wider than a line
    assert plots._wrap("loss at step 100 of 2000 steps", 12) == "loss at\nstep 100\nof 2000\nsteps"  # no chains


def test_bar_ratios_side_by_side_have_one_form():
    ax = plots.compare_bars({"no sync": 0.132, "sync": 0.138, "benchmark": 0.29}, unit="ms", baseline="sync",
                            title="Clocks")
    ratios = [t.get_text().split("\n")[-1] for t in ax.texts]
    assert ratios == ["0.96×", "1.00×", "2.10×"], ratios  # lesson 02 showed "0.95×" beside "1×"
    plt.close("all")
