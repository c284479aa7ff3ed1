"""The Japanese Vowels data set: loading, padding, and length-aware batching (taught in notebook 01).

Paths are resolved from the project root, never from the working directory.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator, Sequence

import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import Dataset, Sampler

from .results import course_file

VOWELS_FILES = {"train": "JapaneseVowels_TRAIN.ts", "test": "JapaneseVowels_TEST.ts"}


def load_japanese_vowels(split: str = "train", root: str | Path | None = None) -> tuple[list[torch.Tensor], list[str]]:
    """Read Japanese Vowels from its ``.ts`` file: a list of ``(T, 12)`` float tensors and string labels (notebook 01).

    The UEA ``.ts`` format: ``#`` comments, ``@`` headers, then one case per line with channels separated by
    ``:``, time steps by ``,`` and the label last.
    """
    if split not in VOWELS_FILES:
        raise ValueError(f"split must be 'train' or 'test', not {split!r}")
    path = Path(root or course_file("data")) / VOWELS_FILES[split]
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: the course ships it in data/; restore it with "
                                f"`git checkout -- data/{VOWELS_FILES[split]}`")
    sequences, labels = [], []
    in_data = False
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("@"):
            in_data = line.lower().startswith("@data")
            continue
        if not in_data:
            continue
        *channels, label = line.split(":")
        try:
            steps = [[float(v) for v in ch.split(",")] for ch in channels]
        except ValueError as exc:
            raise ValueError(f"{path}:{lineno}: not a number ({exc})") from None
        if len({len(s) for s in steps}) != 1:
            raise ValueError(f"{path}:{lineno}: channels have different lengths")
        sequences.append(torch.tensor(steps, dtype=torch.float32).T.contiguous())  # (T, channels)
        labels.append(label.strip())
    if not sequences:
        raise ValueError(f"{path} holds no cases (no @data section?)")
    return sequences, labels


class SequenceDataset(Dataset):
    """Variable-length sequences with int64 targets; items are ``(sequence (T, F), target)`` (notebook 01)."""

    def __init__(self, sequences: Sequence[torch.Tensor], targets: torch.Tensor):
        if len(sequences) != len(targets):
            raise ValueError(f"{len(sequences)} sequences but {len(targets)} targets")
        self.sequences = list(sequences)
        self.targets = torch.as_tensor(targets)

    def __len__(self) -> int:
        return len(self.sequences)

    def __getitem__(self, i):
        return self.sequences[i], self.targets[i]

    @property
    def lengths(self) -> list[int]:
        return [s.shape[0] for s in self.sequences]


def pad_collate(batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pad a list of ``(sequence, target)`` to ``(B, T_max, F)``; return ``(padded, lengths, targets)``.

    ``lengths`` is a CPU ``int64`` tensor, as ``pack_padded_sequence`` requires (notebook 01).
    """
    seqs, targets = zip(*batch)
    lengths = torch.tensor([s.shape[0] for s in seqs], dtype=torch.int64)
    return pad_sequence(list(seqs), batch_first=True), lengths, torch.stack([torch.as_tensor(t) for t in targets])


class BucketBatchSampler(Sampler[list[int]]):
    """Batches of similar length (MATLAB: sort the sequences by length), batch order shuffled each epoch (notebook 01).

    Each epoch: shuffle, stable-sort by length (equal lengths stay shuffled), cut into batches, shuffle
    the batches. ``set_epoch`` makes the order reproducible, like ``DistributedSampler``.
    """

    def __init__(self, lengths: Sequence[int], batch_size: int, shuffle: bool = True, seed: int = 0):
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self.lengths = list(lengths)
        self.batch_size, self.shuffle, self.seed, self.epoch = batch_size, shuffle, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[list[int]]:
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(len(self.lengths), generator=g).tolist() if self.shuffle else \
            list(range(len(self.lengths)))
        order.sort(key=lambda i: self.lengths[i])
        batches = [order[i:i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        if self.shuffle:
            batches = [batches[i] for i in torch.randperm(len(batches), generator=g).tolist()]
        return iter(batches)

    def __len__(self) -> int:
        return -(-len(self.lengths) // self.batch_size)


def padding_fraction(lengths: Sequence[int], batches: Sequence[Sequence[int]]) -> float:
    """Fraction of the padded ``(B, T_max)`` positions that are padding, over all ``batches`` (notebook 01)."""
    padded = real = 0
    for batch in batches:
        ls = [lengths[i] for i in batch]
        padded += len(ls) * max(ls)
        real += sum(ls)
    return 1 - real / padded if padded else 0.0
