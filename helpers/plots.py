"""Figures, kept apart from measuring: each function draws data it is given (notebook 00 on).

Every function returns the matplotlib ``Figure`` so a notebook can show or save it.
"""
from __future__ import annotations

import matplotlib.pyplot as plt


def training_progress(history, title: str = "Training progress"):
    """Loss and accuracy against iteration, with validation points (MATLAB ``Plots="training-progress"``)."""
    hist = history.as_dict() if hasattr(history, "as_dict") else history
    fig, (ax_acc, ax_loss) = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True)
    its = [r["iteration"] for r in hist["iterations"]]
    ax_loss.plot(its, [r["loss"] for r in hist["iterations"]], lw=0.8, alpha=0.7, label="training (per iteration)")
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
    for ax in (ax_acc, ax_loss):
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize="small")
    ax_acc.set_title(title)
    fig.tight_layout()
    return fig


def compare_bars(values: dict, *, unit: str, title: str, baseline: str | None = None, references: dict | None = None,
                 lower_is_better: bool = True):
    """Bars of one figure per label, annotated with its ratio to ``baseline`` (notebook 00).

    ``values`` maps a label ("this machine: cpu") to a number; ``references`` maps a reference
    hardware name to a dict of the same shape and is drawn hatched beside them.
    """
    series = [("this machine", values)] + [(f"reference: {k}", v) for k, v in (references or {}).items()]
    labels = [f"{label}" if name == "this machine" else f"{label}\n({name})"
              for name, vals in series for label in vals]
    heights = [v for _, vals in series for v in vals.values()]
    hatches = ["" if name == "this machine" else "//" for name, vals in series for _ in vals]
    fig, ax = plt.subplots(figsize=(max(5.0, 1.4 * len(heights)), 3.8))
    bars = ax.bar(range(len(heights)), heights, color=[f"C{i % 10}" for i in range(len(heights))], hatch=None)
    for bar, hatch in zip(bars, hatches):
        bar.set_hatch(hatch)
    base = values.get(baseline) if baseline else None
    for bar, h in zip(bars, heights):
        text = f"{h:.3g} {unit}"
        if base:
            ratio = h / base
            text += f"\n{ratio:.2g}× {baseline}"
        ax.annotate(text, (bar.get_x() + bar.get_width() / 2, h), ha="center", va="bottom", fontsize="small")
    ax.set_xticks(range(len(heights)), labels, fontsize="small")
    ax.set_ylabel(f"{unit} ({'lower' if lower_is_better else 'higher'} is better)")
    ax.set_title(title)
    ax.margins(y=0.25)
    fig.tight_layout()
    return fig


def compare_lines(series: dict, *, xlabel: str, ylabel: str, title: str, references: dict | None = None,
                  logx: bool = True, logy: bool = False):
    """Lines of y against x for each series ("cpu", "cuda:0", …), with reference series dashed (notebook 01)."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, points in series.items():
        xs = sorted(points, key=float)
        ax.plot([float(x) for x in xs], [points[x] for x in xs], "o-", label=f"this machine: {name}")
    for ref_name, ref_series in (references or {}).items():
        for name, points in ref_series.items():
            xs = sorted(points, key=float)
            ax.plot([float(x) for x in xs], [points[x] for x in xs], "s--", alpha=0.7,
                    label=f"reference {ref_name}: {name}")
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig
