"""The exercises' checks: each computes its answer from the learner's own run, out of sight (notebooks 00-11), and the
predict-then-measure exercises' feedback (``check_prediction``).

An exercise cell ends with ``check("03.1", copy_us)``: the check reads what the notebook measured (its global
names), so the answer is never printed above the learner's placeholder. The untouched placeholder (None, or
``NOT_ATTEMPTED`` where None can be right) is "not attempted"; a wrong answer raises with a hint, a specific one
for each mistake listed beside the exercise (``tests/test_exercises.py`` tries every one).
"""
from __future__ import annotations

import math
import numbers
import sys
from dataclasses import dataclass, field
from typing import Callable

import torch

from .devices import cpu_bf16_native, usable_cpus
from .diagnose import classify
from .gpt import GPTConfig, flops_per_token
from .models import SequenceClassifier
from .profiling import INPUT_BOUND_SHARE, OVERHEAD_BOUND_BUSY, verdict
from .step import BOUNDS
from .training import evaluate
from .transfer import format_bytes

NOT_ATTEMPTED = "not attempted"  # the placeholder of an exercise whose right answer can be None


@dataclass
class Answer:
    """What is right (``value``, within ``rel_tol``, or ``test(answer)`` True), the hint, and the known mistakes:
    ``(wrong answer, why it is wrong)`` (every exercise, from notebook 00 on)."""

    value: object = None
    hint: str = ""
    rel_tol: float | None = None
    test: Callable | None = None
    wrong: list = field(default_factory=list)

    def same(self, answer, value) -> bool:
        if self.rel_tol is not None and isinstance(answer, numbers.Real) and isinstance(value, numbers.Real):
            return math.isclose(float(answer), float(value), rel_tol=self.rel_tol)
        return bool(answer == value)

    def right(self, answer) -> bool:
        return bool(self.test(answer)) if self.test else self.same(answer, self.value)


def check(key: str, answer, *, namespace: dict | None = None) -> bool:
    """Exercise ``key``'s check (notebook 00 and every lesson after it): "not attempted" on the placeholder, else
    True when ``answer`` is right; a wrong answer raises AssertionError with a hint. ``namespace``: the notebook's
    names (default: the caller's globals, where the lesson's measurements are)."""
    ns = sys._getframe(1).f_globals if namespace is None else namespace
    make, none_is_an_answer = EXERCISES[key]
    want = make(ns)
    if isinstance(want, str):  # nothing to check on this machine: the reason
        print(want)
        return False
    if isinstance(answer, str) and answer == NOT_ATTEMPTED or answer is None and not none_is_an_answer:
        print("Not attempted yet: replace the placeholder above (the solution is in the cell below).")
        return False
    if isinstance(answer, str) and isinstance(want.value, str) and want.value in BOUNDS:  # "Input-bound." too
        answer = "".join(filter(str.isalpha, answer.lower())).removesuffix("bound")
    if not want.right(answer):
        why = next((why for wrong, why in want.wrong if want.same(answer, wrong)), want.hint)
        raise AssertionError(f"{answer!r} is not it. {why}")
    print(f"Correct: {answer}")
    return True


def _ms_double(ns) -> Answer:
    ms = ns["measured"]["cpu"].median_s * 1e3
    return Answer(8 * ms, "At the same rate a 2n×2n product's 2·(2n)³ = 8 × 2·n³ operations take 8 times as long.",
                  0.01, wrong=[(2 * ms, "Twice the size is not twice the work: a product does 2·n³ operations."),
                         (4 * ms, "4× is the growth of the matrices' n² values; the work grows as n³."),
                         (8 * ms / 1e3, "That is seconds: the answer is in milliseconds.")])


def _unseen_label(ns) -> Answer:
    return Answer(test=lambda m: isinstance(m, str) and "'10'" in m and "'1'" in m,
                  hint="Catch the error of encoder.encode(['3', '10']) and keep str(err): it names the unseen label "
                       "and the known classes.", wrong=[("'10'", "That is the label alone: keep the whole message.")])


def _lstm(ns) -> Answer:
    def trained(accuracy):  # unidirectional, this model's own test accuracy, better than guessing a speaker
        lstm = ns.get("lstm")
        if not isinstance(lstm, SequenceClassifier) or lstm.lstm.bidirectional:
            return False
        again = evaluate(lstm, ns["test_loader"], ns["dev"], host_inputs=(1,))
        return abs(accuracy - again["accuracy"]) <= 1 / again["count"] and accuracy > 1 / len(ns["encoder"])
    return Answer(test=trained, hint="Train a SequenceClassifier with bidirectional=False, keep it in lstm and store "
                  "evaluate(lstm, ...)['accuracy'] in lstm_accuracy.",
                  wrong=[(ns.get("test_accuracy"), "That is the BiLSTM's accuracy: train and evaluate the LSTM.")])


def _half_size(ns) -> Answer:
    rates = ns["matmul_results"]["cpu"]["fp32"]
    best = max(rates, key=rates.get)
    return Answer(min(s for s, g in rates.items() if g >= 0.5 * rates[best]),
                  "Look for the first size with GFLOP/s ≥ half the best.",
                  wrong=[(best, "That is the size of the best rate: the first size at half of it comes earlier.")])


def _copy_us(ns) -> Answer:
    gbps = max(ns["bandwidth"]["H2D pinned" if ns["cuda"] else "host→host copy"].values())
    values = 256 * 3 * 32 * 32
    return Answer(values * 4 / (gbps * 1e9) * 1e6, "bytes = 256·3·32·32·4, and GB/s means 1e9 bytes per second.",
                  0.02, wrong=[(values / (gbps * 1e9) * 1e6, "A float32 value is 4 bytes."),
                               (values * 4 / (gbps * 1e9), "That is seconds: the answer is in µs (× 1e6)."),
                               (values * 4 / (gbps * 2**30) * 1e6, "GB/s here is 1e9 bytes per second, not 2**30.")])


def _workers(ns) -> Answer:
    dev, rates = ns["dev"], ns["loader_images_per_s"]
    need = ns["train_images_per_s"][str(dev) if dev.type != "cpu" else "cpu"]
    return Answer(min((w for w, v in rates.items() if v >= need), default=None),
                  f"Look for the first worker count with images/s ≥ {need:.0f} (None if there is none).",
                  wrong=[(max(rates, key=rates.get), f"That is the fastest count: the question asks for the first "
                                                     f"that keeps up with the step (≥ {need:.0f} images/s; None if "
                                                     "none does).")])


def _lr_8(_) -> Answer:
    return Answer(0.8, "The global batch is 8 × 256 = 2048, 8 times the reference 256: the rate is 8 × 0.1.", 1e-9,
                  wrong=[(0.1, "The linear scaling rule changes the rate with the global batch."),
                         (0.1 * 8**0.5, "That is the square-root rule; the linear rule multiplies by 8."),
                         (0.1 / 8, "A larger batch gets a larger rate: multiply by 8.")])


def _diff_small(ns) -> Answer:
    work = ns["work"]

    def from_the_small_runs(d):  # the two files agree to d, and are not section 3's batch-32 run
        if not all((work / name).exists() for name in ("one16.pt", "two8.pt")):
            return False
        one, two = (torch.load(work / name, weights_only=True) for name in ("one16.pt", "two8.pt"))
        diff = ns["max_param_diff"]
        return d <= 1e-6 and d == diff(one, two) and diff(one, ns["one_no_bn"]) > 1e-6
    return Answer(test=from_the_small_runs, hint="Both runs must use --no-bn and the same data, and write "
                  "work / 'one16.pt' and work / 'two8.pt' with --params-out; then compare the two files.")


def _k_min(ns) -> Answer:
    fp16 = [(torch.tensor(1e-8) * 2**k).half().item() for k in range(40)]
    normal = next(k for k in range(40) if fp16[k] >= torch.finfo(torch.float16).tiny)
    return Answer(next(k for k in range(40) if fp16[k] != 0), "Find the first k whose product is not 0 in fp16.",
                  wrong=[(normal, "From there fp16 is normal; below it subnormal values are not 0 yet.")])


def _lr_epoch_55(_) -> Answer:
    return Answer(0.01, "After the drop at epoch 50 the rate is 0.1 × 0.1.", 1e-9,
                  wrong=[(0.1, "StepLR(step_size=50) has dropped the rate once by epoch 55."),
                         (0.001, "One drop by epoch 55: the second comes at epoch 100.")])


def _break_even(ns) -> Answer | str:
    first = next(iter(ns["compiled"].values()))
    if "error" in first or first.get("break_even_steps") is None:
        return "Compiling did not make this step faster here, so it never pays off: nothing to compute."
    saved_ms = first["eager_ms"] - first["compiled_ms"]
    return Answer(first["break_even_steps"], "Saved per step = (eager_ms - compiled_ms) / 1000 seconds, from "
                  "`compiled`'s values, not the rounded prints; divide the compile seconds by it.", 0.01,
                  wrong=[(first["compile_seconds"] / saved_ms, "The saving is in ms: divide it by 1000 first.")])


def _relu_intensity(_) -> Answer:
    return Answer(1 / 8, "One FLOP per value; 4 bytes read + 4 bytes written per value.", 1e-9,
                  wrong=[(1 / 4, "The result is written too: 4 bytes read and 4 written."),
                         (8.0, "Intensity is FLOPs per byte, not bytes per FLOP.")])


def _bound(ns) -> Answer:
    bound = verdict(ns["exercise_phases"], busy_ms=ns["exercise_busy_ms"]).bound
    limits = f"{INPUT_BOUND_SHARE:.0%} and {OVERHEAD_BOUND_BUSY:.0%}"
    why = {"transfer": f"transfer needs an input share of {INPUT_BOUND_SHARE:.0%} or more and copying longer than "
                       "waiting.", "memory": "memory needs the step's floors (lesson 08), which this exercise lacks."}
    return Answer(bound, "Input share: (data wait + copy) / the whole step; then the busy share of forward, backward "
                  "and optimizer.", wrong=[(b, f"Not {b}: " + why.get(b, f"compute both shares and compare them with "
                                                                        f"{limits}.")) for b in BOUNDS if b != bound])


def _batch_16gib(ns) -> Answer:
    fixed, per_image = ns["fixed_mb"], ns["per_image_mb"]
    right = int((16384 - fixed) / per_image)
    return Answer(right, "Subtract the fixed part from the memory, divide by the memory per image, round down.",
                  test=lambda b: isinstance(b, (int, float)) and abs(b - right) <= 1,
                  wrong=[(int(16384 / per_image), "The fixed part (weights, optimizer state) takes memory first.")])


def _bottleneck(ns) -> Answer:
    rates, phases = ns["exercise_rates"], ns["exercise_phases"]
    kind = classify(rates, phases, ns["exercise_floors"], ns["exercise_batch"])[0]
    wait, copy = phases["data wait"], phases["host to device"]
    why = {"transfer": f"copying ({copy:g} ms) is {'shorter' if copy < wait else 'longer'} than waiting ({wait:g} ms)."}
    side = (f"the input alone ({rates['input']:,}/s) is slower than the model alone ({rates['model']:,}/s): that "
            "decides before any floor." if rates["input"] < rates["model"] else
            "first the share of the real step spent outside the model, and whether the phases wait for input.")
    return Answer(kind, "Which side is slower, the input alone or the model alone? Which share of the real step is "
                  "spent outside the model (1 - real / model)? Then compare copying with waiting.",
                  wrong=[(k, f"Not {k}: " + why.get(k, side)) for k in BOUNDS if k != kind])


def _flops_gpt2(ns) -> Answer:
    cfg = GPTConfig(vocab=50_257, seq_len=1024, d_model=768, n_layers=12)
    weights = 6 * (ns["n_blocks"] + cfg.vocab * cfg.d_model)
    return Answer(flops_per_token(cfg, ns["n_blocks"])["total"], "6 × (85e6 + 50257 × 768) for the weights, plus "
                  "12 × 12 × 1024 × 768 for attention.", 0.01,
                  wrong=[(weights, "Attention's scores and weighted sum add 12·L·T·d per token."),
                         (weights / 3, "Training is forward and backward: 6 FLOPs per weight per token, not 2.")])


def _gib_states(ns) -> Answer:
    n = ns["n_total"]
    return Answer(16 * n / 2**30, "4 bytes weight + 4 gradient + 8 for AdamW's two moments = 16 bytes per parameter.",
                  0.01, wrong=[(8 * n / 2**30, "AdamW keeps two moments per parameter: 8 bytes more."),
                               (16 * n / 1e9, "GiB is 2**30 bytes, not 1e9.")])


# key: (the answer from the notebook's names, whether None can be the right answer)
EXERCISES = {"00.1": (_ms_double, False), "01.1": (_unseen_label, False), "01.2": (_lstm, False),
             "02.1": (_half_size, False), "03.1": (_copy_us, False), "04.1": (_workers, True),
             "05.1": (_lr_8, False), "05.2": (_diff_small, False), "06.1": (_k_min, False),
             "07.1": (_lr_epoch_55, False), "08.1": (_break_even, False), "08.2": (_relu_intensity, False),
             "09.1": (_bound, False), "09.2": (_batch_16gib, False), "10.1": (_bottleneck, False),
             "11.1": (_flops_gpt2, False), "11.2": (_gib_states, False)}


def check_prediction(key: str, guess, *, namespace: dict | None = None) -> float | None:
    """A predict-then-measure exercise (notebooks 00-06, 08-11): the learner wrote ``guess`` before the cell that
    measures; this says how far it is from what this machine measured, and what set the measured value. It never
    raises (a prediction is for learning, not a test); returns measured / guess, or None."""
    ns = sys._getframe(1).f_globals if namespace is None else namespace
    measured, unit, why = PREDICTIONS[key][0](ns)
    if guess is None or isinstance(guess, str) and guess == NOT_ATTEMPTED:
        print("No prediction written: write your number in its cell and run that cell, then this one (no need to "
              "measure again).")
        return None
    if not isinstance(guess, numbers.Real) or isinstance(guess, bool):
        print(f"A prediction is a number, not {guess!r}.")
        return None
    if measured is None:
        print(why)
        return None
    ratio = measured / guess if guess > 0 else math.inf
    how = ("within 25 % of your guess" if 0.8 <= ratio <= 1.25 else f"{ratio:.3g} times your guess" if ratio > 1
           else f"1/{1 / ratio:.3g} of your guess" if ratio > 0 else "not above 0")
    print(f"You predicted {guess:g}{unit}; this machine measured {measured:.3g}{unit}: {how}. Why: {why}")
    return ratio


def _run(ns) -> str:
    lesson = ns.get("lesson")
    return ("quick mode, smaller sizes" if getattr(lesson, "quick", False) else
            "sized to a time budget" if getattr(lesson, "budget_s", None) else "")


def _matmul_small_share(ns) -> tuple:
    rates, mode = ns["matmul_results"]["cpu"]["fp32"], _run(ns)
    small, best = min(rates), max(rates, key=rates.get)
    run = f" (this run: {mode}, the largest size n = {max(rates)})" if mode else ""
    return 100 * rates[small] / rates[best], " %", (
        f"at n = {small} the fp32 product made {rates[small]:.0f} GFLOP/s, against {rates[best]:.0f} at its best "
        f"(n = {best}) on {torch.get_num_threads()} thread(s){run}. A product does 2n³ operations on 3n² values: a "
        "large one reuses each value n times and approaches the cores' peak; a small one is over before its fixed "
        "costs (a call, threads waking, memory traffic) are paid back (section 2).")


def _matmul_ms(ns) -> tuple:
    n, t = ns["n"], ns["measured"]["cpu"].median_s
    return t * 1e3, " ms", (
        f"the {n}×{n} product does 2n³ = {2 * n**3 / 1e9:.3g} GFLOP, and this CPU ran it at {2 * n**3 / t / 1e9:.0f} "
        f"GFLOP/s on {torch.get_num_threads()} thread(s): time = operations ÷ rate. Lesson 02 measures how the rate "
        "grows with the size.")


def _step_growth(ns) -> tuple:
    times = ns["step_s"]["cpu"][ns["hidden"]]
    small, large = min(times), max(times)
    grew, run = times[large] / times[small], _run(ns)
    return grew, "×", (
        f"the batch grew {large / small:g}× (batch {small} to {large}, one CPU thread{'; ' + run if run else ''}) and "
        f"the step's time {grew:.3g}×. A time that grows far less than the batch is the cheap test's sign of overhead: "
        "fixed costs per step and per operation set it, not arithmetic (section 5); one that grows as fast as the "
        "batch is compute- or memory-bound.")


def _copy_gbps(ns) -> tuple:
    label = "H2D pinned" if ns["cuda"] else "host→host copy"
    rates = ns["bandwidth"][label]
    large, small = max(rates), min(rates)
    return rates[large], " GB/s", (
        f"the {label} of {format_bytes(large)} (the largest here; {format_bytes(small)} made {rates[small]:.2g} GB/s). "
        "A large copy runs at the rate of its slowest link (main memory on a CPU, the PCIe or NVLink bus to a GPU); a "
        "small one pays a fixed cost per copy first (section 1).")


def _sweep_speedup(ns) -> tuple:
    n = ns["processes"]
    return ns["parallel_sweep_speedup"], "×", (
        f"{n} processes shared {usable_cpus()} usable core(s): at most {n}×. Starting each process, loading the data "
        "in each, and trials of unequal length (the last one finishes alone) take some of it back.")


def _ddp_speedup(ns) -> tuple:
    n = max(int(k) for k in ns["speedup"] if k.isdigit())
    where = ns["worker_device"]
    return ns["speedup"][str(n)], "×", (
        f"DDP with {n} {where} worker(s), against one plain process." + (
            " CPU workers share this machine's cores, so each gets a slice of the same arithmetic, and the gradient "
            "all-reduce comes on top: on one CPU, DDP checks the mechanics, not the speed." if where == "cpu" else
            " Each GPU computes its share; the gradients' all-reduce and a step's fixed costs are not divided."))


def _compile_speedup(ns) -> tuple:
    name, first = next(iter(ns["compiled"].items()))
    if first.get("speedup") is None:
        return None, "", f"{name}: not compiled in this run ({first.get('error', 'left out')})."
    return first["speedup"], "×", (
        f"{name}: compiling fuses chains of elementwise operations into fewer kernels. It gains most where memory "
        "traffic or per-operation overhead bounds the step, least where large matrix products already run near the "
        "peak (section 1)." + (" Below 1×, compiling made this step slower here: measure before you keep it."
                               if first["speedup"] < 1 else ""))


def _checkpoint_time(ns) -> tuple:
    kept = f"It kept {ns['ckpt']['memory_ratio']:.0%} of the peak memory in exchange (section 4)."
    return ns["ckpt"]["time_ratio"], "×", (
        "checkpointing runs the checkpointed blocks' forward again during backward. A backward does about twice a "
        "forward's arithmetic, so one more forward is about a third more (about 1.3×) where arithmetic sets the "
        "time. " + kept)


def _input_gap(ns) -> tuple:
    r = ns["folder_result"]
    return r.model_items_per_s / r.real_items_per_s, "×", (
        f"the model alone trained {r.model_items_per_s:,.0f} images/s, the real step with its loader "
        f"{r.real_items_per_s:,.0f}, the loader alone made {r.input_items_per_s:,.0f}. Decoding one file at a time in "
        "the training process adds its time to every step: the wider the gap, the more an input lever gives back.")


def _gpt_mfu(ns) -> tuple:
    used = ns["utilisation"]
    return 100 * used["mfu"], " %", (
        f"{used['flops_per_s'] / 1e9:.3g} GFLOP/s of model FLOPs against the {used['peak']} "
        f"({used['peak_flops_per_s'] / 1e9:.3g} GFLOP/s). The matrix products run near that peak; layer norms, "
        "softmax and the optimizer step are memory-bound, and every small operation pays its overhead, so a small "
        "model stays well below 100 %.")


def _amp_speedup(ns) -> tuple:
    steps, dev, speedup = ns["step_ms"], ns["dev"], ns["amp_speedup"]
    if speedup is None:
        return None, "", "No half-precision step was measured in this run (its time budget left none)."
    half, mode = min((k for k in steps if not k.startswith(("fp32", "tf32"))), key=steps.get), _run(ns)
    said = f" (fp32 {steps['fp32']:.1f} ms, {half} {steps[half]:.1f} ms per step" + (f"; {mode}" if mode else "") + ")."
    if dev.type == "cpu" and not cpu_bf16_native():
        return speedup, "×", ("this CPU does not report bf16 instructions (the setup note at the top): without them "
                              "bf16 is not faster than fp32, as this lesson measures" + said)
    return speedup, "×", ("autocast runs the convolutions and matrix products in half precision; what the whole "
                          "step gains depends on what bounds it (section 4: a step bound by overhead gains little "
                          "or nothing)" + said)


# key: (measured value, unit and why from the notebook's names; the name the measuring cell assigns)
PREDICTIONS = {"00.p": (_matmul_ms, "measured"), "01.p": (_step_growth, "step_s"),
               "02.p": (_matmul_small_share, "matmul_results"), "03.p": (_copy_gbps, "bandwidth"),
               "04.p": (_sweep_speedup, "parallel_sweep_speedup"),
               "05.p": (_ddp_speedup, "speedup"), "06.p": (_amp_speedup, "amp_speedup"),
               "08.p": (_compile_speedup, "compiled"), "09.p": (_checkpoint_time, "ckpt"),
               "10.p": (_input_gap, "folder_result"), "11.p": (_gpt_mfu, "utilisation")}
