"""Independent trainings in parallel CPU processes: a small hyper-parameter sweep (taught in notebook 04).

MATLAB's Experiment Manager runs trials on parallel workers; here each trial is one process. A function
defined in a notebook cannot be sent to a new process (it does not pickle), so the trial function lives here.
"""
from __future__ import annotations

import multiprocessing
import time
from typing import Callable

from .labels import LabelEncoder
from .models import SequenceClassifier
from .training import evaluate, fit, seed_everything
from .vowels import BucketBatchSampler, SequenceDataset, load_japanese_vowels, pad_collate


def train_vowels(config: dict) -> dict:
    """One trial: train the lesson-01 sequence classifier on Japanese Vowels with ``config``; return its accuracy.
    (notebook 04)

    ``config`` keys: ``hidden`` (units), ``lr``, ``epochs``, ``bidirectional`` (default True), ``seed`` (default 0).
    Uses one CPU thread, so trials in parallel processes do not fight over cores.
    """
    import torch
    from torch.utils.data import DataLoader

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    xs, ys = load_japanese_vowels("train")
    xt, yt = load_japanese_vowels("test")
    enc = LabelEncoder.fit(ys)
    train = SequenceDataset(xs, enc.encode(ys))
    seed_everything(config.get("seed", 0))
    loader = DataLoader(train, batch_sampler=BucketBatchSampler(train.lengths, 27, seed=config.get("seed", 0)),
                        collate_fn=pad_collate)
    model = SequenceClassifier(12, len(enc), hidden=config["hidden"], bidirectional=config.get("bidirectional", True))
    fit(model, loader, epochs=config["epochs"], optimizer=torch.optim.Adam(model.parameters(), lr=config["lr"]),
        device="cpu", host_inputs=(1,), grad_clip=1.0, progress=False)
    test = DataLoader(SequenceDataset(xt, enc.encode(yt)), batch_size=128, collate_fn=pad_collate)
    acc = evaluate(model, test, "cpu", host_inputs=(1,))["accuracy"]
    return {"config": dict(config), "accuracy": acc, "seconds": time.perf_counter() - t0}


def run_sweep(trial: Callable[[dict], dict], configs: list, processes: int = 1) -> tuple[list, float]:
    """Run ``trial(config)`` for every config, one after another (``processes=1``) or in a pool of processes.
    (notebook 04)

    Returns the results in the order of ``configs`` and the wall-clock seconds. The pool uses the ``spawn``
    start method (safe with PyTorch's threads on every OS); each new process pays for importing torch.
    """
    if processes < 1:
        raise ValueError("processes must be at least 1")
    t0 = time.perf_counter()
    if processes == 1:
        out = [trial(c) for c in configs]
    else:
        with multiprocessing.get_context("spawn").Pool(processes) as pool:
            out = pool.map(trial, configs, chunksize=1)
    return out, time.perf_counter() - t0
