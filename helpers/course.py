"""What every notebook does the same way: the preamble, sizes per mode, exercise checks, showing source (every
lesson; notebook 00 shows it).

``setup`` replaces the eight copies of "parameters → device → hardware banner → no-GPU notice → reference
results" that opened the notebooks (notebook 00 explains each part).
"""
from __future__ import annotations

import inspect
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import torch

from . import course_parameters, devices, results
from .exercises import NOT_ATTEMPTED, check, check_prediction  # noqa: F401  the preamble's exercises
from .predictions import PREDICTED

# The GPU size tables' largest step, lesson 11's GPT, is predicted at 4.6 GiB (gpt.memory_prediction; tests/test_gpt.py
# keeps it within a T4): an Apple GPU gets them from this much of Metal's recommended working set, with room to spare.
APPLE_GPU_MIN_GIB = 8


def _display_markdown(text: str) -> None:
    try:
        from IPython.display import Markdown, display
    except ImportError:  # plain Python (a script, a test): print it
        print(text)
        return
    display(Markdown(text))


def _budget_start() -> float:
    """When this notebook's time budget began, on ``time.monotonic``'s clock: when ``tools/run_course.py`` started
    its process (``$COURSE_STARTED``, wall-clock seconds), so the kernel's start and the imports count, as they do
    in the run's plan; else now (``setup()``)."""
    try:
        return time.monotonic() - max(0.0, time.time() - float(os.environ["COURSE_STARTED"]))
    except (KeyError, ValueError):
        return time.monotonic()


@dataclass
class Lesson:
    """One notebook's run: its name, mode, device, hardware, and the committed reference results.
    (notebook 00: every lesson's setup returns one)"""

    notebook: str
    quick: bool
    device: torch.device
    hardware: dict
    reference: dict = field(default_factory=dict)
    budget_s: float | None = None
    started: float = field(default_factory=_budget_start)  # budget_s counts from here
    saved: bool = False  # the whole record is written (save): no partial one after it

    @property
    def on_gpu(self) -> bool:
        """True on a CUDA or Apple GPU, False on the CPU."""
        return self.device.type in ("cuda", "mps")

    @property
    def mode(self) -> str:
        """``"quick"``, ``"cpu"`` or ``"gpu"``: which column of a notebook's size table applies. An Apple GPU gets
        the GPU column only with ``APPLE_GPU_MIN_GIB`` of Metal's recommended working set (a Mac's memory is shared)."""
        if self.quick:
            return "quick"
        if self.device.type == "mps":
            return "gpu" if devices.apple_gpu_gib() >= APPLE_GPU_MIN_GIB else "cpu"
        return "gpu" if self.on_gpu else "cpu"

    def sizes(self, *, quick: dict, cpu: dict, gpu: dict) -> SimpleNamespace:
        """Pick this run's sizes from the notebook's table (one dict per mode, the same keys in each)."""
        if not set(quick) == set(cpu) == set(gpu):
            raise ValueError(f"the size table's modes name different sizes: quick {sorted(quick)}, cpu {sorted(cpu)}, "
                             f"gpu {sorted(gpu)}")
        if self.device.type == "mps" and self.mode == "cpu":
            print(f"Apple GPU with {devices.apple_gpu_gib():.1f} GiB of Metal's recommended working set: this run "
                  f"uses the CPU column of the size table (the GPU column needs about {APPLE_GPU_MIN_GIB} GiB)")
        return SimpleNamespace(**{"quick": quick, "cpu": cpu, "gpu": gpu}[self.mode])

    def within_budget(self, wanted: int, seconds_each: float, *, share: float = 1.0, minimum: int = 1,
                      what: str = "epochs") -> int:
        """How many of ``wanted`` units (epochs, runs) fit in ``share`` of the budget left at ``seconds_each``; all of
        them when there is no budget. Prints what it chose, so a budgeted run says what it left out (``make
        gpu-check`` sets ``budget_s``)."""
        if self.budget_s is None:
            return wanted
        left = self.seconds_left(share)
        fit = int(left // max(seconds_each, 1e-9))
        chosen = max(minimum, min(wanted, fit))
        print(f"time budget: {left:.0f} s ({share:.0%} of what is left) at about {seconds_each:.2g} s each → "
              f"{chosen} of {wanted} {what}" + ("" if chosen == wanted else " (the full run: budget_s = None)"))
        return chosen

    def seconds_left(self, share: float = 1.0) -> float | None:
        """Seconds of ``budget_s`` not yet spent (times ``share``), None without a budget (``make gpu-check``)."""
        if self.budget_s is None:
            return None
        return max(0.0, share * (self.budget_s - (time.monotonic() - self.started)))

    def affords(self, seconds: float, what: str, *, share: float = 1.0) -> bool:
        """True when ``share`` of the budget left covers ``seconds`` (always without a budget); else says what is
        left out and returns False (notebook 08: a compile that would not fit)."""
        left = self.seconds_left(share)
        if left is None or left >= seconds:
            return True
        print(f"time budget: {what} left out (needs about {seconds:.0f} s, {left:.0f} s left; the full run: "
              "budget_s = None)")
        return False

    def work_dir(self) -> Path:
        """This run's scratch folder (see ``helpers.results.work_dir``)."""
        return results.work_dir(self.notebook)

    def save(self, record: dict) -> Path:
        """Record the notebook's headline results with the hardware, mode and device (``build/results``)."""
        self.saved = True
        path = results.save_results(self.notebook, record, quick=self.quick, device=str(self.device),
                                    hardware=self.hardware, budget_s=self.budget_s)
        print("recorded:", results.shown_path(path))  # not this machine's folders
        if not results.in_checkout():  # Colab, Kaggle, a bare folder: one file to download and keep
            print(f"to keep this run's results, download {results.shown_path(results.pack_results())} (Colab: the "
                  "Files panel; Kaggle: the Output panel); tools/promote_reference.py reads it as it is")
        return path

    def save_partial(self, namespace: dict) -> Path | None:
        """Record what the notebook has measured so far, marked ``"partial": true``: its plain-data variables
        (numbers, text, and lists and dicts of them). Under a time budget ``setup`` calls this after every cell
        until ``save`` writes the whole record, so a notebook stopped at its limit still leaves its
        measurements (``make gpu-check``)."""
        if self.saved:
            return None
        found = {k: v for k, v in namespace.items() if not k.startswith("_") and k not in _NOT_RESULTS
                 and _plain(v)}
        if not found:
            return None
        return results.save_results(self.notebook, found, quick=self.quick, device=str(self.device),
                                    hardware=self.hardware, budget_s=self.budget_s, partial=True)

    def reference_names(self) -> str:
        return ", ".join(f"`{name}`" for name in self.reference)


_NOT_RESULTS = {"In", "Out", "exit", "quit", "get_ipython", "quick", "device", "budget_s"}


def _plain(value, depth: int = 0, budget: list | None = None) -> bool:
    """True for plain data worth keeping as a partial result: numbers, short text, None, and lists, tuples and
    dicts of them (at most 4 deep and 10,000 values in all)."""
    budget = [10_000] if budget is None else budget
    budget[0] -= 1
    if budget[0] < 0 or depth > 4:
        return False
    if value is None or isinstance(value, (bool, int, float)):
        return True
    if isinstance(value, str):
        return len(value) <= 200
    if isinstance(value, (list, tuple)):
        return bool(value) and all(_plain(v, depth + 1, budget) for v in value)
    if isinstance(value, dict):
        return bool(value) and all(isinstance(k, (str, int, float)) and _plain(v, depth + 1, budget)
                                   for k, v in value.items())
    return False


def _save_after_each_cell(lesson: "Lesson") -> None:
    """Under a time budget, keep what the notebook has measured after every cell (``Lesson.save_partial``)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None:
        return
    shell.events.register("post_run_cell", lambda result: lesson.save_partial(shell.user_ns))


def setup(notebook: str, quick: bool, device: str, *, needs: str | None = "gpu", note: str = "",
          budget_s: float | None = None, predicts: bool = False) -> Lesson:
    """The preamble of every notebook: parameters, device, "Your hardware" banner, no-GPU notice (notebook 00).

    - ``COURSE_QUICK`` / ``COURSE_DEVICE`` (set by ``make test``) override ``quick`` and ``device``;
    - ``device`` is checked (a one-line ``ValueError`` naming what exists) and, on CUDA, made current;
    - when the run lacks what the lesson ``needs`` (``"gpu"``: CUDA or MPS; ``"cuda"``; None: nothing), a visible
      notice says so and names the committed
      reference results that the figures will show instead (``note`` adds the lesson's own sentence);
    - ``budget_s`` (a notebook parameter) bounds the notebook's longest work through ``Lesson.within_budget``,
      and the notebook's measurements so far are saved after every cell, marked partial (``Lesson.save_partial``);
    - ``predicts``: the lesson's GPU sections show predictions from the GPU datasheet where no reference exists
      (``helpers.predictions``), and the notice says so;
    - without CUDA, ``KINETO_LOG_LEVEL`` defaults to 6 (silent): the profiler's own log lines are noise there.
    """
    quick, device = course_parameters(quick, device)
    dev = devices.make_current(devices.pick_device(device))
    if not torch.cuda.is_available():  # the profiler's C++ side (Kineto) prints its start, its stop and "ERROR …
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # gpuGetDeviceCount failed" on a machine with no CUDA: noise
    lesson = Lesson(notebook, quick, dev, devices.describe(), results.load_reference(notebook), budget_s)
    if budget_s is not None:
        print(f"time budget: {budget_s:.0f} s for this notebook (make gpu-check); what is sized to fit it says so")
        _save_after_each_cell(lesson)  # stopped at its limit, the notebook still leaves what it measured
    _display_markdown(f"**Your hardware** (this notebook runs on `{dev}`, quick mode: {quick})\n\n"
                      + devices.describe_markdown(lesson.hardware))
    if (needs == "gpu" and not lesson.on_gpu) or (needs == "cuda" and dev.type != "cuda"):
        refs = (f"GPU results appear from committed reference runs ({lesson.reference_names()})." if lesson.reference
                else "No GPU reference result is committed yet for this notebook" + (
                    ": its GPU sections show figures predicted from GPU datasheets instead, each labelled "
                    f"“{PREDICTED}”." if predicts else "."))
        what = "No GPU" if needs == "gpu" else "No CUDA GPU"
        _display_markdown(" ".join(p for p in (f"**{what} in use here.**", note, refs) if p))
    return lesson


SOLUTION_MARK = "# %% exercise "


def solution_sections(notebook: str) -> dict:
    """``{exercise number: code}`` from ``solutions/<notebook>.py``, whose sections start with ``# %% exercise N``.
    (notebook 00)"""
    path = results.course_file("solutions", f"{notebook}.py")
    sections, current = {}, None
    for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
        if line.startswith(SOLUTION_MARK):
            current = int(line[len(SOLUTION_MARK):].split()[0])
            sections[current] = ""
        elif current is not None:
            sections[current] += line
    return {k: v.strip("\n") + "\n" for k, v in sections.items()}


def solution(notebook: str, exercise: int, *, run: bool | None = None) -> None:
    """Show an exercise's solution from ``solutions/<notebook>.py`` without running it (notebook 00).

    "Run All" therefore never overwrites your answer. ``run=True`` runs it in the notebook (it ends with the same
    ``check`` as the exercise); ``make test`` sets ``COURSE_RUN_SOLUTIONS=1``, so CI proves every solution passes.
    """
    code = solution_sections(notebook)[exercise]
    run = os.environ.get("COURSE_RUN_SOLUTIONS") == "1" if run is None else run
    _display_markdown(f"**Solution {exercise}** (`solutions/{notebook}.py`" + (
        ", run here)" if run else f"; not run — `solution({notebook!r}, {exercise}, run=True)` runs it)")
        + f":\n\n```python\n{code}```")
    if run:
        exec(compile(code, f"solutions/{notebook}.py, exercise {exercise}", "exec"), sys._getframe(1).f_globals)


def show_source(obj) -> str:
    """Show the source of a helper as a code block, so what the notebook shows is what runs (notebooks 01, 03)."""
    code = inspect.getsource(obj)
    where = Path(inspect.getsourcefile(obj)).relative_to(results.project_root())
    _display_markdown(f"`{where}`:\n\n```python\n{code}```")
    return code
