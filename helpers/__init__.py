"""Helpers for the course "GPU training performance in PyTorch".

One module per concept, in the floors of ``LAYERS``: a module imports only from floors below its own
(``tests/test_house.py`` reads the source, imports inside functions included, and fails on an upward import or a
circle). Importing does no work: no device probing, no data. How the lessons call it: notebook 00.
"""
import os

# The floors of the package, from the ground up: (what the floor is, its modules). A newcomer reads from the top:
# the notebook preamble and figures call the applications, which run the training loop, which measures against
# the ceilings, built from the pieces below, which time one step on a device.
LAYERS = (
    ("devices: pick, describe, synchronise, precision; text wrapping", ("devices", "text")),
    ("results files: save, load, where they go", ("results",)),
    ("the training step: precision, scaler, batch to the device, the step; what bounds it", ("step",)),
    ("synchronised clocks: time_fn, time_train_step", ("timing",)),
    ("data, models, schedules; counting a step (FLOPs, bytes, operators); timed copies and operations; "
     "what torch.compile buys",
     ("labels", "vowels", "cifar10", "models", "schedules", "counting", "transfer", "operations", "compiling")),
    ("measured and published ceilings, MFU; the profiler and memory; torchrun from a notebook",
     ("ceilings", "profiling", "launcher")),
    ("predictions on datasheet GPUs; the training loop (fit, evaluate, checkpoints); the small GPT and its "
     "measurements", ("predictions", "training", "gpt")),
    ("what the lessons run: sweeps, the DDP per-rank program, FSDP2, diagnose",
     ("sweep", "distributed", "sharding", "diagnose")),
    ("the exercises' checks, their answers computed from the learner's run", ("exercises",)),
    ("the notebook preamble, solutions, figures", ("course", "plots")),
)


def course_parameters(quick: bool, device: str) -> tuple[bool, str]:
    """Apply ``COURSE_QUICK=1`` / ``COURSE_DEVICE=…`` from the environment over a notebook's parameters.

    nbval cannot inject papermill parameters, so ``make test`` sets these variables instead; when they
    are unset the notebook's own values stand (notebook 00).
    """
    env_quick = os.environ.get("COURSE_QUICK")
    if env_quick is not None:
        quick = env_quick.strip().lower() in ("1", "true", "yes")
    return quick, os.environ.get("COURSE_DEVICE") or device
