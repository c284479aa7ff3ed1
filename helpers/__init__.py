"""Helpers for the course "GPU training performance in PyTorch".

One module per concept: ``devices``, ``timing``, ``results``, ``training``, ``plots`` (and, from
notebook 01 on, ``labels``, ``data``, ``models``). Importing does no work: no device probing, no data.
"""
import os


def course_parameters(quick: bool, device: str) -> tuple[bool, str]:
    """Apply ``COURSE_QUICK=1`` / ``COURSE_DEVICE=…`` from the environment over a notebook's parameters.

    nbval cannot inject papermill parameters, so ``make test`` sets these variables instead; when they
    are unset the notebook's own values stand (notebook 00).
    """
    env_quick = os.environ.get("COURSE_QUICK")
    if env_quick is not None:
        quick = env_quick.strip().lower() in ("1", "true", "yes")
    return quick, os.environ.get("COURSE_DEVICE") or device
