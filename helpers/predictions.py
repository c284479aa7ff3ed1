"""The step time the ceilings imply, predicted before it is measured (taught in notebook 08; the predicted GPU
numbers of notebooks 01-06 are built with it): ``predict_step``, per datasheet GPU ``predict_gpus`` and the
``predicted_*`` functions, and ``check_predictions`` against this machine's measurements.
"""
from __future__ import annotations

import os

import torch

from .ceilings import (
    datasheet,
    datasheet_ceilings,
    datasheet_name,
    dtype_peak,
    launch_cost,
    main_dtype,
    measured_ceilings,
)
from .counting import count_fn, count_step
from .devices import float32_precision
from .timing import time_fn, time_train_step
from .transfer import pcie_theoretical

# The datasheet GPUs a prediction shows by default: a free notebook's GPU, a common rental, a current flagship.
DEFAULT_GPUS = ("T4", "A100 80GB SXM", "H100 SXM")
PREDICTED = "predicted from the datasheet, not measured"


def _gpu_count(model, batch, device="cpu", **count_kw):
    """``count_step`` of the step as a CUDA GPU runs it: the optimizer's foreach kernels, where a CPU runs a
    for-loop over the parameters (``counting.count_step``), unless ``count_kw`` says otherwise."""
    return count_step(model, batch, device, **{"foreach": True, **count_kw})


def _host_op_s(op_s: float | None) -> float:
    """The host's cost per operator for a prediction: ``op_s``, or this machine's CPU's measured one."""
    return measured_ceilings("cpu")["op_s"] if op_s is None else op_s


def predict_step(work, ceilings: dict) -> dict:
    """Predict a training step's time from its counts and a machine's ceilings: a per-operator roofline (notebook 08).

    Each operator's device time is ``max(flops / peak of its dtype, bytes / bandwidth)`` (compute- or memory-bound,
    whichever is slower); the host pays ``op_s`` per operator dispatched and ``launch_s`` per kernel it launches; a
    host→device copy takes ``h2d_bytes / h2d_bytes_per_s`` when the ceilings know the link. Overlap: on a CPU the host does
    the work itself, so the step is host + device time, summed; on a GPU (``overlap`` True) the host runs ahead of
    the device, so the step is ``max(host, device)``, the slower of the two, not their sum. Returns seconds per
    regime, the step, and ``bound``: ``"overhead"`` when the host's dispatching (or, summed, the per-operator costs)
    takes longest, else ``"compute"``, ``"memory"`` or ``"transfer"``, the largest share of the device time.
    ``work`` is a ``StepWork`` or its ``state_dict()``.
    """
    work = work.state_dict() if hasattr(work, "state_dict") else work
    rates, bandwidth = ceilings["flops_per_s"], ceilings["bytes_per_s"]
    compute_s = memory_s = 0.0
    by_op: dict[str, float] = {}
    for row in work["rows"]:
        c = row["flops"] / dtype_peak(rates, row["dtype"]) if row["flops"] else 0.0
        m = row["bytes"] / bandwidth
        seconds = max(c, m) * row["calls"]
        compute_s, memory_s = (compute_s + seconds, memory_s) if c >= m else (compute_s, memory_s + seconds)
        by_op[row["op"]] = by_op.get(row["op"], 0.0) + seconds
    link = ceilings.get("h2d_bytes_per_s")
    transfer_s = work.get("h2d_bytes", 0) / link if link else 0.0
    launch_s = work["kernels"] * ceilings.get("launch_s", 0.0)
    host_s = work["ops"] * ceilings["op_s"] + launch_s
    device_s = compute_s + memory_s + transfer_s
    overhead_s = host_s
    shares = {"compute": compute_s, "memory": memory_s, "transfer": transfer_s}
    if ceilings.get("overlap"):
        step_s = max(host_s, device_s)
        bound = "overhead" if host_s >= device_s else max(shares, key=shares.get)
    else:
        step_s = host_s + device_s
        bound = max({**shares, "overhead": overhead_s}.items(), key=lambda kv: kv[1])[0]
    top = dict(sorted(by_op.items(), key=lambda kv: kv[1], reverse=True)[:8])
    return {"step_s": step_s, "compute_s": compute_s, "memory_s": memory_s, "overhead_s": overhead_s,
            "transfer_s": transfer_s, "host_s": host_s, "device_s": device_s, "bound": bound,
            "overlap": bool(ceilings.get("overlap")), "top_ops_s": top}


def chosen_gpus() -> tuple:
    """The datasheet GPUs the lessons predict for: ``$COURSE_GPUS`` (a comma list of datasheet names, or ``all``),
    else ``DEFAULT_GPUS``; a name the datasheet lacks is a one-line error that lists the names it has (notebook 08)."""
    wanted = os.environ.get("COURSE_GPUS", "").strip()
    if not wanted:
        return DEFAULT_GPUS
    known = tuple(datasheet())
    if wanted.lower() == "all":
        return known
    names = tuple(n.strip() for n in wanted.split(",") if n.strip())
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"COURSE_GPUS names {', '.join(map(repr, unknown))}, which data/gpu_datasheet.json does not "
                         f"hold; choose from {', '.join(known)}, or all")
    return names


def gpus_here(gpus=None) -> tuple:
    """``gpus``, or by default the GPUs of ``chosen_gpus`` (``$COURSE_GPUS``) and the datasheet entry of the CUDA
    GPU in use, if it has one: on a GPU the datasheet knows, every prediction can be set against a measurement
    (notebooks 01-08)."""
    if gpus is not None:
        return tuple(gpus)
    chosen = chosen_gpus()
    own = datasheet_name(torch.device("cuda", torch.cuda.current_device())) if torch.cuda.is_available() else None
    return chosen + ((own,) if own and own not in chosen else ())


def usable(predictions: dict, say=print) -> dict:
    """The predictions of ``predict_gpus`` that hold a prediction; each GPU skipped is said with its reason (a GPU
    whose datasheet lacks the dtype), never dropped silently (notebooks 01-08)."""
    for gpu, p in predictions.items():
        if "skipped" in p:
            say(f"{gpu}: not predicted ({p['skipped']})")
    return {gpu: p for gpu, p in predictions.items() if "skipped" not in p}


def measured_over_predicted(measured: dict, predicted: dict) -> dict:
    """``{key: measured / predicted}`` for every key both hold a positive number for (a nested dict: per key, the
    same again) — how far a prediction was from the measurement on the GPU it was made for (notebooks 01-08)."""
    found = {}
    for key, m in measured.items():
        p = predicted.get(key)
        if isinstance(m, dict) and isinstance(p, dict):
            inner = measured_over_predicted(m, p)
            found.update({key: inner} if inner else {})
        elif isinstance(m, (int, float)) and isinstance(p, (int, float)) and m > 0 and p > 0:
            found[key] = m / p
    return found


def predict_gpus(work, gpus=None, *, op_s: float | None = None, copy_batch: bool = True) -> dict:
    """``predict_step`` of ``work`` on each datasheet GPU in ``gpus``: ``{name: prediction}`` (notebooks 01-08).

    The host's per-operator cost ``op_s`` is this machine's (default: ``measured_ceilings("cpu")``); each kernel adds
    the cited launch cost, and the batch crosses the host link (``input_bytes``, when the count saw no copy). A GPU
    whose datasheet has no peak for the work's dtype gets ``{"skipped": why}`` instead:
    a missing number is never guessed. Every prediction carries ``label``: ``PREDICTED``.
    """
    sheet, work, gpus = datasheet(), dict(work.state_dict() if hasattr(work, "state_dict") else work), gpus_here(gpus)
    # counted on a CPU, the step copied nothing: a GPU run copies the batch (unless it is resident: copy_batch False)
    work["h2d_bytes"] = max(work.get("h2d_bytes", 0), work.get("input_bytes", 0)) if copy_batch else 0
    op_s = _host_op_s(op_s)
    found, dtype = {}, main_dtype(work)
    for name in gpus:
        try:
            if dtype not in sheet[name]["flops_per_s"]:  # no fall-back to another dtype's peak: that is a guess
                raise ValueError(f"the datasheet has no {dtype} peak for {name}")
            found[name] = {**predict_step(work, datasheet_ceilings(sheet[name], op_s=op_s)), "label": PREDICTED}
        except (KeyError, ValueError) as err:
            found[name] = {"skipped": str(err).strip("'\"")}
    return found


def predicted_sweep(points: dict, gpus=None, *, op_s: float | None = None, copy_batch: bool = True,
                    **count_kw) -> dict:
    """Count one step per sweep point and predict it on each GPU: ``points`` maps x (a batch size, a width) to
    ``(model, batch)``; ``count_kw`` go to ``count_step`` (notebooks 01 and 02). ``copy_batch=False`` predicts the
    step with its batch already on the GPU, as ``helpers.timing.time_train_step`` times it by default.

    Returns ``{"items_per_s": {gpu: {x: predicted items/s}}, "step_s": {gpu: {x: s}}, "bound": {gpu: {x: regime}},
    "skipped": {gpu: why}, "work": {x: {"flops", "bytes", "ops", "kernels"}}, "label": PREDICTED}``.
    """
    op_s = _host_op_s(op_s)
    found = {"items_per_s": {}, "step_s": {}, "bound": {}, "skipped": {}, "work": {}, "label": PREDICTED}
    for x, (model, batch) in points.items():
        work = _gpu_count(model, batch, "cpu", **count_kw)
        found["work"][x] = {k: getattr(work, k) for k in ("flops", "bytes", "ops", "kernels", "items")}
        for gpu, p in predict_gpus(work, gpus, op_s=op_s, copy_batch=copy_batch).items():
            if "skipped" in p:
                found["skipped"][gpu] = p["skipped"]
                continue
            found["step_s"].setdefault(gpu, {})[x] = p["step_s"]
            found["items_per_s"].setdefault(gpu, {})[x] = work.items / p["step_s"]
            found["bound"].setdefault(gpu, {})[x] = p["bound"]
    return found


def predicted_matmul(sizes, dtype: str = "float32", gpus=None, *, op_s: float | None = None,
                     detail: bool = False) -> dict:
    """Predicted GFLOP/s of an ``n×n @ n×n`` product on each datasheet GPU, for each ``n`` in ``sizes``: one operator
    of ``2n³`` FLOPs reading two and writing one ``n×n`` matrix, timed back to back as notebook 02 times it (the
    host issues the next call while the device works). ``{gpu: {n: GFLOP/s}}``, or with ``detail``
    ``{gpu: {n: {"gflops", "bound"}}}`` (the regime that binds, notebook 08); a GPU without a peak for ``dtype``
    is left out (notebook 02)."""
    op_s = _host_op_s(op_s)
    itemsize = torch.empty(0, dtype=getattr(torch, "float32" if dtype == "tf32" else dtype)).element_size()
    found = {}
    for n in sizes:
        work = {"rows": [{"op": "aten.mm", "dtype": dtype, "flops": 2 * n**3, "bytes": 3 * n * n * itemsize,
                          "kernel": True, "calls": 1}], "ops": 1, "kernels": 1, "h2d_bytes": 0}
        for gpu, p in predict_gpus(work, gpus, op_s=op_s).items():
            if "step_s" in p:
                gflops = 2 * n**3 / p["step_s"] / 1e9
                found.setdefault(gpu, {})[n] = {"gflops": gflops, "bound": p["bound"]} if detail else gflops
    return found


def predicted_copy(sizes, gpus=None, *, op_s: float | None = None) -> dict:
    """Predicted host→device bandwidth from pinned memory on each datasheet GPU's PCIe link, for each size in bytes:
    ``size / (per-copy host cost + size / link rate)``, the per-copy cost being this machine's cost per operator plus
    the cited launch cost, the link rate the theoretical one-direction rate of its generation and width
    (``helpers.transfer.pcie_theoretical``). ``{gpu: {"link", "gbps": {size: GB/s}}}``; a GPU whose link is not a
    PCIe link of known width is left out (notebook 03)."""
    op_s = _host_op_s(op_s)
    fixed, found, sheet = op_s + launch_cost()["value"], {}, datasheet()
    for gpu in gpus_here(gpus):
        link = sheet[gpu].get("host_link", {})
        if link.get("kind") != "PCIe" or not (link.get("generation") and link.get("lanes")):
            continue
        rate = pcie_theoretical(link["generation"], link["lanes"])["gbps"] * 1e9
        found[gpu] = {"link": f"PCIe Gen{link['generation']} x{link['lanes']}",
                      "gbps": {s: s / (fixed + s / rate) / 1e9 for s in sizes}}
    return found


def _relabelled(work, old: str, new: str):
    """``work``'s counts with the operators of dtype ``old`` marked as ``new`` (same sizes, another peak)."""
    found = work.state_dict() if hasattr(work, "state_dict") else dict(work)
    found["rows"] = [{**r, "dtype": new if r["dtype"] == old else r["dtype"]} for r in found["rows"]]
    return found


def predicted_training(make_model, batch, *, images: int, epochs: int = 1, amp: bool = False, gpus=None,
                       input_items_per_s: float | None = None, op_s: float | None = None, **count_kw) -> dict:
    """Predicted time of ``epochs`` epochs of ``images`` items, in steps like one on ``batch``, on one of each
    datasheet GPU (notebook 05): ``{gpu: {"epoch_s", "total_s", "step_s", "bound", "dtype", "label"}}``.

    ``amp=True`` counts the step in the dtype autocast picks on that GPU (``helpers.step.resolve_amp``): bf16
    where the datasheet has a bf16 peak, else fp16. An fp16 step is the bf16 count with its dtype renamed: both are
    2-byte types that autocast applies to the same operators, and a CPU without fp16 arithmetic would take many
    times longer to run the step in fp16 than to count it in bf16. ``input_items_per_s``: the input pipeline's rate as measured
    here; an epoch takes at least ``images / input_items_per_s`` and ``bound`` says ``"input"`` when that binds.
    """
    sheet, works, found, gpus = datasheet(), {}, {}, gpus_here(gpus)
    steps = -(-images // int(batch[-1].shape[0]))
    for gpu in gpus:
        dtype = ("bfloat16" if "bfloat16" in sheet[gpu]["flops_per_s"] else "float16") if amp else None
        for need in (["bfloat16"] if dtype == "float16" else []) + [dtype]:
            if need not in works:  # fp16: the bf16 count, relabelled (see the docstring)
                works[need] = _relabelled(works["bfloat16"], "bfloat16", "float16") if need == "float16" else \
                    _gpu_count(make_model(), batch, "cpu", amp=need or False, **count_kw)
        p = predict_gpus(works[dtype], (gpu,), op_s=op_s)[gpu]
        if "skipped" in p:
            found[gpu] = p
            continue
        model_s, input_s = steps * p["step_s"], images / input_items_per_s if input_items_per_s else 0.0
        found[gpu] = {"epoch_s": max(model_s, input_s), "total_s": epochs * max(model_s, input_s),
                      "step_s": p["step_s"], "bound": "input" if input_s > model_s else p["bound"],
                      "dtype": dtype or "float32", "label": PREDICTED}
    return found


def predicted_amp_speedup(make_model, batch, gpus=None, *, op_s: float | None = None, **count_kw) -> dict:
    """Predicted speed-up of autocast (bf16 where the datasheet has a bf16 peak, else fp16) over true fp32 for one
    training step on ``batch``, per datasheet GPU (notebook 06): ``{gpu: {"fp32_ms", "amp_ms", "amp_dtype",
    "speedup", "bound": {"fp32", "amp"}, "label"}}``, or ``{"skipped": why}``."""
    items, gpus = int(batch[-1].shape[0]), gpus_here(gpus)
    plain = predicted_training(make_model, batch, images=items, gpus=gpus, op_s=op_s, **count_kw)
    mixed = predicted_training(make_model, batch, images=items, amp=True, gpus=gpus, op_s=op_s, **count_kw)
    found = {}
    for gpu in gpus:
        a, b = plain[gpu], mixed[gpu]
        if "skipped" in a or "skipped" in b:
            found[gpu] = {"skipped": a.get("skipped") or b.get("skipped")}
            continue
        found[gpu] = {"fp32_ms": a["step_s"] * 1e3, "amp_ms": b["step_s"] * 1e3, "amp_dtype": b["dtype"],
                      "speedup": a["step_s"] / b["step_s"], "bound": {"fp32": a["bound"], "amp": b["bound"]},
                      "label": PREDICTED}
    return found


def check_predictions(cases: dict, device="cpu", *, ceilings: dict | None = None, min_run_time: float = 0.3,
                      gpus=None) -> dict:
    """Predict each case on ``device`` from its counts and the device's measured ceilings, then measure it: the
    model checked where it can be (notebook 08). ``cases`` maps a name to ``{"model", "batch", **count_step
    options}`` (a training step, timed by ``helpers.timing.time_train_step``) or ``{"fn", "args"}`` (one call,
    timed by ``helpers.timing.time_fn``). Returns ``{name: {"flops", "bytes", "ops", "kernels", "predicted_s",
    "measured_s", "ratio" (measured / predicted), "bound", "gpus"}}``, ``gpus`` holding the same counts predicted on
    each datasheet GPU (``predict_gpus``). Nothing is fitted: the ceilings are measured once. Every case is timed
    in true fp32 (``float32_precision("ieee")``): the fp32 peak it is divided by is true fp32's, while cuDNN's
    convolutions and RNNs would run TF32 by default on Ampere and newer GPUs.
    """
    ceilings = ceilings or measured_ceilings(device)
    host_op_s = ceilings["op_s"] if str(ceilings.get("device", "cpu")) == "cpu" else None  # a CPU's, not a GPU's
    found = {}
    with float32_precision("ieee"):
        for name, case in cases.items():
            case = dict(case)  # a call's inputs live on the device already; a training step copies its batch
            if "fn" in case:
                fn, args = case["fn"], [a.to(device) for a in case["args"]]
                work = gpu_work = count_fn(fn, *[a.cpu() for a in case["args"]])
                measured = time_fn(lambda: fn(*args), device, min_run_time=min_run_time).median_s
            else:
                model, batch = case.pop("model"), case.pop("batch")
                work = count_step(model, batch, device, **case)  # counts on a copy: model stays untrained
                gpu_work = work if torch.device(device).type == "cuda" else _gpu_count(model, batch, device, **case)
                options = {k: v for k, v in case.items() if k in ("optimizer", "amp", "host_inputs", "channels_last")}
                if isinstance(options.get("optimizer"), type):  # a class: time_train_step wants an instance
                    options["optimizer"] = options["optimizer"](model.parameters(), lr=0.01)
                measured = time_train_step(model, batch, device, min_run_time=min_run_time, **options).median_s
            p = predict_step(work, ceilings)
            on_gpus = {gpu: {k: g[k] for k in ("step_s", "bound")} if "step_s" in g else g
                       for gpu, g in predict_gpus(gpu_work, gpus, op_s=host_op_s, copy_batch="fn" not in case).items()}
            found[name] = {"flops": work.flops, "bytes": work.bytes, "ops": work.ops, "kernels": work.kernels,
                           "predicted_s": p["step_s"], "measured_s": measured, "ratio": measured / p["step_s"],
                           "bound": p["bound"], "gpus": on_gpus}
    return found
