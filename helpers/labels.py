"""Categorical (string) labels <-> int64 class indices (taught in notebook 01).

A GPU holds numbers, not strings: the class *names* stay on the host in an encoder, the class *indices*
(an ``int64`` tensor) go to the device, and predictions come back as indices that the encoder turns
into names again. MATLAB: ``categorical``/``grp2idx`` encode, ``categories`` lists, ``scores2label`` decodes.
"""
from __future__ import annotations

import re
from typing import Iterable, Sequence

import torch


class UnseenLabelError(ValueError):
    """A label the encoder was not fitted on (notebook 01)."""


def _natural_key(value) -> tuple:
    # "2" < "10", and mixed types still compare (by type name first)
    text = str(value)
    return (type(value).__name__,) + tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text))


def _as_list(labels) -> list:
    if isinstance(labels, torch.Tensor):
        return labels.tolist()
    if hasattr(labels, "cat") and hasattr(labels.cat, "categories"):  # pandas Series of dtype category
        return list(labels.astype(object))
    if hasattr(labels, "tolist"):  # numpy arrays, pandas objects
        return labels.tolist()
    return list(labels)


class LabelEncoder:
    """Map class names to indices ``0..K-1`` and back, in a fixed class order (MATLAB ``categories``) (notebook 01)."""

    def __init__(self, classes: Sequence):
        classes = list(classes)
        if len(set(classes)) != len(classes):
            raise ValueError(f"classes must be unique, got {classes}")
        if not classes:
            raise ValueError("a label encoder needs at least one class")
        self.classes = classes
        self._index = {c: i for i, c in enumerate(classes)}

    @classmethod
    def fit(cls, labels: Iterable) -> "LabelEncoder":
        """Learn the classes from strings, any hashable objects, or a pandas ``Categorical``/category Series.

        A pandas categorical keeps its own category order (as MATLAB's ``categories``); anything else is
        sorted naturally ("2" before "10").
        """
        cat = labels.cat if hasattr(labels, "cat") and hasattr(labels.cat, "categories") else labels
        if hasattr(cat, "categories") and hasattr(cat, "codes"):
            return cls(list(cat.categories))
        return cls(sorted(set(_as_list(labels)), key=_natural_key))

    def __len__(self) -> int:
        return len(self.classes)

    def __repr__(self) -> str:
        return f"LabelEncoder({self.classes!r})"

    def encode(self, labels: Iterable, device: str | torch.device | None = None) -> torch.Tensor:
        """Class indices as an ``int64`` tensor, optionally created on ``device`` (MATLAB ``grp2idx`` - 1)."""
        values = _as_list(labels)
        unseen = sorted({v for v in values if v not in self._index}, key=_natural_key)
        if unseen:
            shown = ", ".join(map(repr, unseen[:10])) + (" …" if len(unseen) > 10 else "")
            raise UnseenLabelError(f"unseen label(s) {shown}: the encoder knows {self.classes!r}; "
                                   "fit it on data that contains them, or drop those samples")
        return torch.tensor([self._index[v] for v in values], dtype=torch.int64, device=device)

    def decode(self, indices_or_scores) -> list:
        """Class names for indices (1-D) or for score rows (2-D, the top score wins: MATLAB ``scores2label``)."""
        t = torch.as_tensor(indices_or_scores)
        if t.dim() == 2:
            t = t.argmax(dim=1)
        if t.dim() != 1:
            raise ValueError(f"decode takes indices of shape (N,) or scores of shape (N, {len(self)}), "
                             f"got {tuple(t.shape)}")
        if t.is_floating_point():
            raise ValueError("decode got floating-point values of shape (N,): pass int64 indices or (N, K) scores")
        idx = t.cpu().tolist()  # the one device->host copy
        bad = [i for i in idx if not 0 <= i < len(self)]
        if bad:
            raise ValueError(f"indices {sorted(set(bad))[:10]} are outside 0..{len(self) - 1}")
        return [self.classes[i] for i in idx]

    def state_dict(self) -> dict:
        """Plain data (a list of names) to store beside the weights; loads with ``weights_only=True``."""
        for c in self.classes:
            if not isinstance(c, (str, int, float, bool)):
                raise TypeError(f"class {c!r} is a {type(c).__name__}: only str/int/float/bool classes can be "
                                "saved as plain data")
        return {"classes": list(self.classes)}

    @classmethod
    def from_state_dict(cls, state: dict) -> "LabelEncoder":
        """Rebuild an encoder saved with ``state_dict`` (for example from a checkpoint)."""
        return cls(state["classes"])
