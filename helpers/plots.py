"""Figures, kept apart from measuring: each function draws data it is given (notebook 00 on).

Every function takes ``ax=None``: pass an ``Axes`` (or, for the two-panel figures, a pair of them) to draw into
a figure of your own, or leave it out and get a new figure. Each returns the ``Axes`` it drew on.
"""
from __future__ import annotations

import re

import matplotlib.pyplot as plt
from matplotlib import ticker
from matplotlib.layout_engine import PlaceHolderLayoutEngine
from matplotlib.transforms import Bbox

from .text import wrap


def _axes(ax, figsize, ncols: int = 1):
    """The given axes, or new ones in a new figure (one or ``ncols`` side by side, constrained layout)."""
    if ax is not None:
        return ax
    _, ax = plt.subplots(1, ncols, figsize=figsize, layout="constrained")
    return ax


def _finish(ax, title: str | None = None, legend: bool = True, grid: bool = True) -> None:
    if title:
        ax.set_title(_wrap(title, _chars(ax, ax.title.get_fontsize())))
    if ax.get_ylabel():  # a y label longer than the axes is tall would run into the title or the x labels
        tall = ax.get_position().height * ax.figure.get_figheight() * 72 * 0.8
        ax.set_ylabel(_wrap(ax.get_ylabel(), int(tall / (0.55 * ax.yaxis.label.get_fontsize()))))
    if grid:
        ax.grid(alpha=0.3, which="both")
    handles, labels = ax.get_legend_handles_labels()
    if legend and handles:  # many or long entries go beside the axes, where they cover neither data nor text
        beside = len(handles) > 4 or max(len(s) for s in labels) > 30
        ax.legend(handles, [_wrap(s, 32) for s in labels] if beside else labels, fontsize="small",
                  **({"loc": "upper left", "bbox_to_anchor": (1.01, 1.0)} if beside else {}))
    _layout(ax.figure)


def _layout(fig) -> None:
    """Lay the figure out: its own engine if it has one (our figures: constrained), else ``tight_layout`` (which
    leaves a placeholder engine behind: a figure of yours that several calls draw into is laid out each time)."""
    if isinstance(fig.get_layout_engine(), (type(None), PlaceHolderLayoutEngine)):
        fig.tight_layout()


def _wrap(text: str, width: int) -> str:
    """``text`` broken into lines of at most ``width`` characters (its own line breaks kept), where a reader
    expects it (``helpers.text.wrap``: at spaces, never inside "cpu-intel-xeon", "14.6 ms" or "batch 32")."""
    return "\n".join(wrap(line, max(width, 6)) or line for line in str(text).split("\n"))


def _suptitle(fig, title: str) -> None:
    """A title over the whole figure, at the size of an axes title (not smaller: the site shows figures scaled to
    its column), broken into lines that fit the figure's width."""
    size = plt.rcParams["axes.titlesize"]
    text = fig.suptitle(title, fontsize=size)
    text.set_text(_wrap(title, int(fig.get_figwidth() * 72 * 0.95 / (0.55 * text.get_fontsize()))))


def _chars(ax, fontsize: float, share: float = 1.0) -> int:
    """How many characters of ``fontsize`` points fit across ``share`` of the axes' width."""
    width_pt = ax.get_position().width * ax.figure.get_figwidth() * 72 * share
    return int(width_pt / (0.55 * fontsize))


def _overlap(texts, gap: float = 0.0) -> bool:
    """Whether any two of these texts' rendered extents overlap, or come closer than ``gap`` pixels (the figure
    is drawn to measure them)."""
    texts = [t for t in texts if t.get_visible() and t.get_text()]
    if len(texts) < 2:
        return False
    renderer = texts[0].figure.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer).padded(gap / 2 if gap else -0.5) for t in texts]
    return any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])


def _measured(fig) -> None:
    """Lay the figure out as it will be shown, so text extents can be measured."""
    fig.draw_without_rendering()


def _fit_xticklabels(ax) -> None:
    """x tick labels that would run into each other: wrapped to the room each has, else turned upright."""
    labels = [t for t in ax.get_xticklabels() if t.get_text()]
    _measured(ax.figure)
    if not _overlap(labels):
        return
    ticks, size = ax.get_xticks(), labels[0].get_fontsize()
    originals = [t.get_text() for t in ax.get_xticklabels()]
    wrapped = [_wrap(text, _chars(ax, size, 0.9 / len(labels))) for text in originals]
    if max(w.count("\n") for w in wrapped) < 4:
        ax.set_xticks(ticks, wrapped, fontsize=size)
        _measured(ax.figure)
        if not _overlap([t for t in ax.get_xticklabels() if t.get_text()]):
            return
    ax.set_xticks(ticks, originals, fontsize=size)
    ax.tick_params(axis="x", labelrotation=90)


def _shrink_to_fit(texts, smallest: float = 5.0, gap: float = 0.0) -> None:
    """Make these texts smaller (down to ``smallest`` points) until none overlaps another, or comes closer than
    ``gap`` pixels."""
    texts = list(texts)
    _measured(texts[0].figure) if texts else None
    while texts and _overlap(texts, gap) and texts[0].get_fontsize() > smallest:
        for t in texts:
            t.set_fontsize(t.get_fontsize() * 0.85)
        _measured(texts[0].figure)


def _plain_log_ticks(axis) -> None:
    """A log axis spanning under two decades: ticks at 1, 2 and 5 × 10^k, written as plain numbers (not 6×10^1)."""
    low, high = sorted(axis.get_view_interval())
    if low <= 0 or high / low >= 100:
        return
    axis.set_major_locator(ticker.LogLocator(base=10, subs=(1, 2, 5)))
    axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 100 else f"{v:g}"))
    axis.set_minor_formatter(ticker.NullFormatter())


def _whole_number_ticks(ax) -> None:
    """An x axis whose lines all sit at whole numbers (threads, workers, epochs) ticks at whole numbers only: no
    1.25 threads."""
    values = [float(x) for line in ax.get_lines() for x in line.get_xdata()]
    if values and all(v.is_integer() for v in values):
        ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))


def _sorted_points(points: dict) -> tuple[list, list]:
    xs = sorted(points, key=float)
    return [float(x) for x in xs], [points[x] for x in xs]


def training_progress(history, title: str = "Training progress", ax=None):
    """Loss and accuracy against iteration, with validation points (MATLAB ``Plots="training-progress"``) (notebook 01).

    ``ax``: a pair ``(accuracy_axes, loss_axes)``, or None for a new two-row figure.
    """
    hist = history.state_dict() if hasattr(history, "state_dict") else history
    if ax is None:
        _, ax = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True)
    ax_acc, ax_loss = ax
    ax_loss.plot([r["iteration"] for r in hist["iterations"]], [r["loss"] for r in hist["iterations"]], lw=0.8,
                 alpha=0.7, label="training (per iteration)")
    epochs = hist["epochs"]
    ax_acc.plot([e["iteration"] for e in epochs], [100 * e["train_accuracy"] for e in epochs], "o-", ms=3,
                label="training (epoch mean)")
    if hist["validation"]:
        v_its = [r["iteration"] for r in hist["validation"]]
        ax_acc.plot(v_its, [100 * r["accuracy"] for r in hist["validation"]], "s--", ms=4, color="k",
                    label="validation")
        ax_loss.plot(v_its, [r["loss"] for r in hist["validation"]], "s--", ms=4, color="k", label="validation")
    ax_acc.set_ylabel("accuracy (%)")
    ax_loss.set_ylabel("loss")
    ax_loss.set_xlabel("iteration")
    _finish(ax_loss)
    _finish(ax_acc, title)
    return ax


def compare_bars(values: dict, *, unit: str, title: str, baseline: str | None = None, references: dict | None = None,
                 predictions: dict | None = None, lower_is_better: bool | None = None, ax=None):
    """Bars of one figure per label, annotated with its ratio to ``baseline`` (notebook 00).

    ``lower_is_better`` (None: a rate, a unit in "/s", is better higher; any other unit, lower) names the
    direction on the y label.

    ``values`` maps a label ("this machine: cpu") to a number; ``references`` maps a reference
    hardware name to a dict of the same shape and is drawn hatched beside them; ``predictions`` maps a GPU name
    to such a dict, drawn with a lighter hatch and labelled as predicted (``helpers.predictions.predict_gpus``).
    """
    series = [("this machine", values)] + [(f"reference: {k}", v) for k, v in (references or {}).items()] + \
        [(f"{k}: predicted", v) for k, v in (predictions or {}).items()]
    labels = [label if name == "this machine" else f"{label}\n({name})" for name, vals in series for label in vals]
    heights = [v for _, vals in series for v in vals.values()]
    ax = _axes(ax, (min(12.0, max(5.0, 1.4 * len(heights))), 3.8))
    bars = ax.bar(range(len(heights)), heights, color=[f"C{i % 10}" for i in range(len(heights))])
    for bar, (name, _) in zip(bars, [(n, lab) for n, vals in series for lab in vals]):
        bar.set_hatch("" if name == "this machine" else ".." if name.endswith(": predicted") else "//")
        bar.set_alpha(0.6 if name.endswith(": predicted") else 1.0)
    base = values.get(baseline) if baseline else None
    notes = [ax.annotate(f"{_number(h)} {unit}" + (f"\n{_ratio(h / base)}" if base else ""),
                         (bar.get_x() + bar.get_width() / 2, h), ha="center", va="bottom", fontsize="small")
             for bar, h in zip(bars, heights)]
    ax.set_xticks(range(len(heights)), labels, fontsize="small")
    lower = re.search(r"/s\b", unit) is None if lower_is_better is None else lower_is_better
    ax.set_ylabel(f"{unit} ({'lower' if lower else 'higher'} is better)")
    notes_x = ([f"× = ratio to “{baseline}”"] if base else []) + \
        ([f"dotted bars: {PREDICTED_LABEL}"] if predictions else [])
    if notes_x:  # the ratio's reference is named once, not on every bar; predicted bars are named as such
        ax.set_xlabel(_wrap("; ".join(notes_x), _chars(ax, 10)), fontsize="small")
    ax.margins(y=0.25)
    _finish(ax, title, legend=False, grid=False)
    _fit_xticklabels(ax)
    _fit_bar_notes(ax, notes, unit)
    _layout(ax.figure)  # again: the labels and the y limit changed
    return ax


def _ratio(r: float) -> str:
    """A ratio with two decimals from 0.1 to 10 (1.00×, 0.95×, 2.43×: the same form side by side), else three
    significant digits (0.0123×, 13.9×); the form is chosen from the rounded value (9.996 is 10.0×)."""
    return f"{round(r, 2):.2f}×" if 0.1 <= abs(round(r, 2)) < 10 else f"{r:.3g}×"


def _number(x: float) -> str:
    """Three significant digits below 1,000 (0.0123, 1.23, 123), whole numbers with separators above (14,823):
    never e-notation for the sizes a figure shows."""
    return f"{x:,.0f}" if 1e3 <= abs(x) < 1e15 else f"{x:.3g}"


BAR_NOTE_GAP = 10.0  # pixels between neighbouring bars' numbers (a character and a half): closer, they read as one


def _fit_bar_notes(ax, notes: list, unit: str) -> None:
    """Bar annotations: without the unit (the y label has it) where they collide, smaller if they still do, and
    inside the axes (the y limit raised), clear of the title."""
    _measured(ax.figure)
    if _overlap(notes, BAR_NOTE_GAP):
        for t in notes:
            t.set_text(t.get_text().replace(f" {unit}", "", 1))
    _shrink_to_fit(notes, gap=BAR_NOTE_GAP)
    _room_above(ax, notes)


def _room_above(ax, notes: list) -> None:
    """Raise the y limit (linear axes) until these texts, written above their points, stay inside the axes."""
    if not notes or ax.get_yscale() != "linear":
        return
    renderer = ax.figure.canvas.get_renderer()
    top, box = max(t.get_window_extent(renderer).y1 for t in notes), ax.get_window_extent(renderer)
    if top > box.y1 - 3:
        low, high = ax.get_ylim()
        ax.set_ylim(low, high + (top - box.y1 + 6) / box.height * (high - low) * 1.3)


PREDICTED_LABEL = "predicted from the datasheet, not measured"


def _merged_predictions(predictions: dict) -> dict:
    """GPUs whose predicted points coincide (to 0.1 %: an overhead-bound step costs every GPU the same) under one label,
    ``"T4, A100: ..."``, so that identical lines are drawn once (notebook 01)."""
    groups: list = []
    for gpu, points in (predictions or {}).items():
        for names, shared in groups:
            if shared.keys() == points.keys() and all(abs(points[x] - y) <= 1e-3 * abs(y) for x, y in shared.items()):
                names.append(gpu)
                break
        else:
            groups.append(([gpu], points))
    return {", ".join(names): points for names, points in groups}


def compare_lines(series: dict, *, xlabel: str, ylabel: str, title: str, references: dict | None = None,
                  predictions: dict | None = None, logx: bool = True, logy: bool = False, ax=None):
    """Lines of y against x for each series ("cpu", "cuda:0", …), with reference series dashed and predicted ones
    dotted, each prediction's legend entry saying it was predicted, not measured (notebook 01); predictions that
    coincide are drawn as one line naming all their GPUs.

    ``series`` maps a name to ``{x: y}``; ``references`` maps a reference hardware name to such a dict;
    ``predictions`` maps a GPU name to ``{x: y}`` (``helpers.predictions.predict_gpus``).
    """
    ax = _axes(ax, (7, 4))
    for name, points in series.items():
        ax.plot(*_sorted_points(points), "o-", label=f"this machine: {name}")
    for ref_name, ref_series in (references or {}).items():
        for name, points in ref_series.items():
            ax.plot(*_sorted_points(points), "s--", alpha=0.7, label=f"reference {ref_name}: {name}")
    for gpu, points in _merged_predictions(predictions).items():
        ax.plot(*_sorted_points(points), "^:", alpha=0.8, label=f"{gpu}: {PREDICTED_LABEL}")
    if logx:
        ax.set_xscale("log", base=2)
        if ax.get_xlim()[1] <= 5000:  # batch sizes read as numbers (1, 2, 4, …, 4096), not as powers of 2
            ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    else:
        _whole_number_ticks(ax)
    if logy:
        ax.set_yscale("log")
        _plain_log_ticks(ax.yaxis)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    _finish(ax, title)
    return ax


def scaling(speedup: dict, *, label: str, title: str, references: dict | None = None,
            predictions: dict | None = None, ax=None):
    """Speed-up against the number of workers, with the ideal linear line, reference curves and predicted ones
    (notebook 05)."""
    ax = compare_lines({label: speedup}, xlabel="workers (GPUs or CPU processes)", references=references,
                       predictions=predictions, ylabel="speed-up over one plain process (×)", title=title,
                       logx=False, ax=ax)
    top = max([float(k) for k in speedup] + [float(k) for r in (references or {}).values() for s in r.values()
                                              for k in s] + [float(k) for p in (predictions or {}).values() for k in p])
    ax.plot([1, top], [1, top], ":", color="gray", label="ideal (linear)")
    _finish(ax, title)
    return ax


def confusion_matrix(confusion, classes: list, *, title: str, ax=None, xlabel: str = "predicted class",
                     ylabel: str = "true class"):
    """A confusion matrix (rows: true class, columns: predicted) with the counts written in (notebook 01)."""
    ax = _axes(ax, (5.2, 4.5))
    k = len(classes)
    ax.imshow(confusion, cmap="Blues")
    top = float(confusion.max())
    counts = [ax.text(j, i, int(confusion[i, j]), ha="center", va="center", fontsize="small",
                      color="white" if float(confusion[i, j]) > top / 2 else "black")
              for i in range(k) for j in range(k) if confusion[i, j]]
    ax.set_xticks(range(k), classes)
    ax.set_yticks(range(k), classes)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    _finish(ax, title, legend=False, grid=False)
    _fit_xticklabels(ax)
    _shrink_to_fit(counts)  # many classes: smaller counts, each inside its cell
    return ax


_DEVICE_COLOURS = ["C0", "C2", "C3", "C4", "C5", "C6", "C8", "C9"]  # the default cycle without orange (C1) and grey
_HOST_HATCHES = ["", "//", "..", "xx"]


def phase_bar(phase_ms: dict, *, title: str, ax=None, host_marker: str = "CPU"):
    """One horizontal bar split into the phases of a step, host phases (``host_marker`` in their name) in orange,
    the others in colours that are never orange (notebook 04)."""
    ax = _axes(ax, (10, 1.9))
    left, total = 0.0, sum(phase_ms.values())
    names, hosts = [], 0
    for i, (name, ms) in enumerate(phase_ms.items()):
        host = host_marker in name  # host phases: orange, told apart by their hatch
        ax.barh(0, ms, left=left, color="tab:orange" if host else _DEVICE_COLOURS[i % 8], edgecolor="k",
                hatch=_HOST_HATCHES[hosts % 4] if host else "")
        hosts += host
        clear = {"facecolor": "white", "alpha": 0.7, "lw": 0, "pad": 1} if host and hosts > 1 else None  # on hatch
        names.append(ax.text(left + ms / 2, 0, f"{name}\n{ms:.1f} ms", ha="center", va="center", fontsize="small",
                             bbox=clear))
        left += ms
    ax.set_yticks([])
    ax.set_xlim(0, total)
    ax.set_xlabel("milliseconds within one step (median)")
    _finish(ax, title, legend=False, grid=False)
    _label_segments(ax, names, [p.get_width() for p in ax.patches])
    return ax


def _legend_beside(ax) -> None:
    """A legend right of the axes, in as many columns as it takes to be no taller than the axes (a short axes in
    a stack of them would otherwise push its legend into its neighbours' labels)."""
    n = len(ax.get_legend_handles_labels()[0])
    for ncols in range(1, n + 1):
        legend = ax.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.01, 0.5), ncols=ncols)
        _measured(ax.figure)
        renderer = ax.figure.canvas.get_renderer()
        if legend.get_window_extent(renderer).height <= ax.get_window_extent(renderer).height * 1.05:
            return


def _label_segments(ax, texts: list, widths: list) -> None:
    """Keep each segment's label where it fits inside the segment (else its number alone, else nothing); the
    phases whose name is not written in go to a legend beside the bar."""
    _measured(ax.figure)
    renderer, to_px = ax.figure.canvas.get_renderer(), ax.transData
    missing = []
    for t, width, patch in zip(texts, widths, ax.patches):
        room = abs(to_px.transform((patch.get_x() + width, 0))[0] - to_px.transform((patch.get_x(), 0))[0]) - 4
        name, _, number = t.get_text().rpartition("\n")
        if t.get_window_extent(renderer).width > room:
            t.set_text(number)
            missing.append((patch, name))
            if t.get_window_extent(renderer).width > room:
                t.set_visible(False)
    if missing:
        ax.legend(*zip(*missing), fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
        _layout(ax.figure)


def image_grid(images, titles: list | None = None, *, title: str = "", ncols: int = 8, ax=None):
    """Images (``uint8`` or ``[0, 1]`` float, ``(N, C, H, W)``) in a grid, each with its title (notebooks 04, 05).

    ``ax``: an array of at least ``len(images)`` axes, or None for a new figure.
    """
    if ax is None:
        nrows = -(-len(images) // ncols)
        _, ax = plt.subplots(nrows, ncols, figsize=(1.4 * ncols, 1.5 * nrows), squeeze=False, layout="constrained")
    flat = list(ax.flat) if hasattr(ax, "flat") else list(ax)
    for i, a in enumerate(flat):
        a.axis("off")
        if i < len(images):
            a.imshow(images[i].permute(1, 2, 0))
            if titles:
                a.set_title(_wrap(titles[i], _chars(a, 8)), fontsize="small")
    if title:
        _suptitle(flat[0].figure, title)
    _layout(flat[0].figure)
    _shrink_to_fit([a.title for a in flat if a.get_title()])
    return ax


def lr_curves(curves: dict, *, title: str = "", steps_per_epoch: int | None = None, logy: bool = False, ax=None):
    """Learning rate against optimizer step for each named schedule, epoch boundaries in grey (notebook 07)."""
    ax = _axes(ax, (9, 3.8))
    for name, values in curves.items():
        ax.plot(range(len(values)), [max(v, 1e-30) for v in values] if logy else values, label=name)
    n = max(len(v) for v in curves.values())
    if steps_per_epoch:
        for boundary in range(steps_per_epoch, n, steps_per_epoch):
            ax.axvline(boundary, color="gray", lw=0.3)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel("optimizer step" + (f" ({steps_per_epoch} per epoch; grey lines: epoch boundaries)"
                                      if steps_per_epoch else ""))
    ax.set_ylabel("learning rate" + (" (log)" if logy else ""))
    _finish(ax, title, grid=False)
    return ax


def recipe_histories(runs: dict, *, title: str = "", minutes: bool = False, ax=None):
    """Training and validation accuracy, and learning rate, per epoch for named runs (notebook 05).

    ``runs`` maps a name to a ``History.state_dict()``; ``ax`` is a pair ``(accuracy_axes, lr_axes)``.
    ``minutes=True`` puts each epoch's end at the training minutes spent so far (runs of equal time compared).
    """
    import itertools

    ax = _axes(ax, (12, 3.8), ncols=2)
    for k, (name, hist) in enumerate(runs.items()):
        ep = hist["epochs"]
        xs = list(itertools.accumulate(e["seconds"] / 60 for e in ep)) if minutes else [e["epoch"] for e in ep]
        ax[0].plot(xs, [100 * e["train_accuracy"] for e in ep], "o-", ms=3, color=f"C{k}", label=f"{name}: training")
        ax[0].plot(xs, [100 * e.get("val_accuracy", float("nan")) for e in ep], "s--", ms=3, color=f"C{k}",
                   label=f"{name}: validation")
        ax[1].plot(xs, [e["lr"] for e in ep], "o-", ms=3, label=name)
    ax[0].set_ylabel("accuracy (%)")
    ax[1].set_ylabel("learning rate at epoch end")
    for a in ax:
        a.set_xlabel("minutes of training" if minutes else "epoch")
        if not minutes:
            _whole_number_ticks(a)
        _finish(a)
    if title:
        _suptitle(ax[0].figure, title)
        _layout(ax[0].figure)  # again, now that the title takes room
    return ax


def float_formats(ax=None):
    """Range (length of each bar) and precision (its height) of fp32, fp16 and bf16 (notebook 06)."""
    import numpy as np
    import torch

    ax = _axes(ax, (8, 3.6))
    x = np.logspace(-40, 40, 1601)  # wide enough for fp32's and bf16's whole normal range (1.2e-38 … 3.4e38)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        f = torch.finfo(dtype)
        ok = (x >= f.smallest_normal) & (x <= f.max)
        bits = round(-np.log2(f.eps))  # mantissa bits: eps = 2^-bits
        ax.plot(x[ok], np.full(ok.sum(), f.eps), lw=3, label=f"{dtype}: relative step 2^-{bits}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("magnitude of the value")
    ax.set_ylabel("relative spacing of neighbours")
    _finish(ax, "Range (length of the bar) and precision (height) of each format")
    return ax


def ddp_diagram(ranks: int = 3, ax=None):
    """A schematic of data parallelism: replicas on batch slices, gradients all-reduced (notebook 05)."""
    ax = _axes(ax, (10, 3.6))
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 4.2)
    ax.axis("off")
    width, boxes = 9.2 / ranks - 0.7, []
    for r in range(ranks):
        x = 0.4 + r * 9.2 / ranks
        ax.add_patch(plt.Rectangle((x, 2.6), width, 1.2, fc="#dbe9f6", ec="k"))
        text = f"rank {r}\nbatch slice {r}  →  replica\nforward, backward" if ranks <= 4 else f"rank {r}\nslice {r}"
        boxes.append(ax.text(x + width / 2, 3.2, text, ha="center", va="center", fontsize="small"))
        ax.annotate("", xy=(x + width / 2, 1.55), xytext=(x + width / 2, 2.55), arrowprops=dict(arrowstyle="<->"))
        if r == 0 or ranks <= 4:  # many ranks: the first arrow is named, the others are the same
            boxes.append(ax.text(x + width / 2 + 0.05, 2.05, "gradients", fontsize="x-small"))
    ax.add_patch(plt.Rectangle((0.4, 0.5), 9.2, 1.0, fc="#fde2c8", ec="k"))
    ax.text(5, 1.0, "all-reduce: every rank gets the average gradient, then takes the same optimizer step",
            ha="center", va="center", fontsize="small")
    _finish(ax, "DistributedDataParallel: global batch = batch per rank × ranks, learning rate scaled with it",
            legend=False, grid=False)
    _shrink_to_fit(boxes)
    return ax


def roofline(points: dict, *, peak_gflops: float, peak_gbps: float, title: str, references: dict | None = None,
             datasheet: dict | None = None, ax=None):
    """Attainable GFLOP/s against arithmetic intensity (FLOP per byte): the memory slope, the compute roof, and
    each measured point (notebook 08). ``references`` maps a hardware name to its measured
    ``(peak_gflops, peak_gbps)``, ``datasheet`` a GPU name to its datasheet ones (dotted, named as not measured)."""
    import numpy as np

    ax = _axes(ax, (7.5, 4.5))
    xs = np.logspace(-3, 4, 200)
    roofs = [("this machine", peak_gflops, peak_gbps, "-")] + [
        (f"reference: {name}", g, b, "--") for name, (g, b) in (references or {}).items()] + [
        (f"{name}: datasheet peaks, not measured", g, b, ":") for name, (g, b) in (datasheet or {}).items()]
    for k, (label, g, b, style) in enumerate(roofs):  # datasheet roofs in colours of their own, apart from points
        color = "gray" if style != ":" else ("tab:olive", "tab:cyan", "tab:pink", "tab:brown")[k % 4]
        ax.plot(xs, np.minimum(g, b * xs), style, color=color, lw=1.5 if style == "-" else 1, label=label)
    for k, (name, p) in enumerate(points.items()):
        ax.plot(max(p["intensity"], 1e-3), p["gflops"], "o", ms=8, color=f"C{k}", label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved)")
    ax.set_ylabel("GFLOP/s achieved")
    _finish(ax, title)
    return ax


def phase_stack(runs: dict, *, title: str, share: bool = False, ax=None):
    """Horizontal stacked bars, one per run, split into the phases of a step (notebook 09).

    ``runs`` maps a name ("this machine", "reference: …") to ``{phase: ms}``; the same phase has the same colour
    in every bar, and parts wider than 6 % of their bar are labelled. ``share=True`` draws each bar as 100 % of
    its step, to compare the shape of steps of very different lengths (a CPU's and a GPU's).
    """
    names = list(runs)
    phases = list(dict.fromkeys(p for r in runs.values() for p in r))
    ax = _axes(ax, (10, 1.0 + 0.6 * len(names)))
    for row, name in enumerate(names):
        left, total = 0.0, sum(runs[name].values()) or 1.0
        for i, ph in enumerate(phases):
            value = runs[name].get(ph, 0.0) * (100 / total if share else 1)
            ax.barh(row, value, left=left, color=f"C{i}", edgecolor="k", label=ph if row == 0 else None)
            if value > 0.06 * (100 if share else total):
                ax.text(left + value / 2, row, f"{value:.3g}", ha="center", va="center", fontsize="x-small")
            left += value
    ax.set_yticks(range(len(names)), names, fontsize="small")
    ax.invert_yaxis()
    ax.set_xlabel("% of the training step" if share else "ms per training step")
    _legend_beside(ax)
    _finish(ax, title, legend=False, grid=False)
    return ax


def memory_search(trials: dict, *, limit_mb: float | None, title: str, ax=None):
    """Peak memory of each batch an out-of-memory search tried, failures as red crosses at the limit (notebook 09).

    ``trials`` maps a batch size to its peak MB, or to None where it ran out of memory.
    """
    ax = _axes(ax, (7, 3.8))
    ok = {int(b): mb for b, mb in trials.items() if mb is not None}
    failed = [int(b) for b, mb in trials.items() if mb is None]
    ax.plot(list(ok), list(ok.values()), "o", color="C0", label="fits (measured peak)")
    if limit_mb is not None:
        ax.axhline(limit_mb, color="C3", ls="--", label=f"limit {limit_mb:.0f} MB")
        ax.plot(failed, [limit_mb] * len(failed), "x", color="C3", ms=10, mew=2,
                label="torch.OutOfMemoryError (recovered)")
    order = [ax.annotate(str(i + 1), (int(b), trials[b] if trials[b] is not None else limit_mb), xytext=(0, 7),
                         textcoords="offset points", fontsize="x-small", ha="center")
             for i, b in enumerate(trials) if trials[b] is not None or limit_mb is not None]
    ax.set_xlabel("batch size (images); numbers: order of the trials")
    ax.set_ylabel("peak memory of one step (MB)")
    _finish(ax, title)
    _unstack(order, _marker_boxes(ax))
    _room_above(ax, order)
    _unstack(order, _marker_boxes(ax))  # the raised y limit moved the points: clear them again
    return ax


def _marker_boxes(ax) -> list:
    """The extent in pixels of every marker the axes' lines draw (a label written over one hides it)."""
    _measured(ax.figure)
    boxes = []
    for line in ax.get_lines():
        if line.get_marker() in (None, "None", "", " "):
            continue
        half = (line.get_markersize() / 2 + line.get_markeredgewidth()) * ax.figure.dpi / 72  # points → pixels
        for x, y in ax.transData.transform(line.get_xydata()):
            boxes.append(Bbox.from_extents(x - half, y - half, x + half, y + half))
    return boxes


def _unstack(notes: list, avoid: list = ()) -> None:
    """Point labels that would cover earlier ones (or any box in ``avoid``: markers) are lifted, a line at a time,
    until they are clear."""
    if notes:
        _measured(notes[0].figure)
    for k, note in enumerate(notes):
        for _ in range(12):  # a gap of 2 px to the earlier labels, so that "7", "9" do not read as "79"
            box = note.get_window_extent(note.figure.canvas.get_renderer()).padded(-0.5)
            if not any(_overlap([note, e], gap=2) for e in notes[:k]) and not any(box.overlaps(m) for m in avoid):
                break
            note.xyann = (note.xyann[0], note.xyann[1] + 0.9 * note.get_fontsize())
