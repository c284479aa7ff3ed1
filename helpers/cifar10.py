"""The CIFAR-10 data set: loading it three ways, a synthetic stand-in, and augmentation (notebooks 04-07).

Paths are resolved from the project root, never from the working directory.
"""
from __future__ import annotations

import contextlib
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import Dataset

from .devices import synchronize
from .results import cache_dir, in_checkout, project_root, shown_path

CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp")


@dataclass
class ImageSet:
    """Images as one ``uint8`` tensor ``(N, C, H, W)``, ``int64`` labels, class names and where they came from.
    (notebooks 05, 10)"""

    images: torch.Tensor
    labels: torch.Tensor
    classes: list
    source: str

    def __len__(self) -> int:
        return len(self.labels)

    def state_dict(self) -> dict:
        return {"images": self.images, "labels": self.labels, "classes": list(self.classes), "source": self.source}


def _folder_root(path: Path) -> Path | None:
    for candidate in (path, path / "CIFAR-10-images"):
        if (candidate / "train").is_dir() and (candidate / "test").is_dir():
            return candidate
    return None


def _class_files(root: Path, per_class: int | None) -> tuple[list, list, list]:
    """``(class names, files, labels)`` of an image-folder tree ``root/<class>/<image>``, ``per_class`` of each."""
    classes = sorted(d.name for d in root.iterdir() if d.is_dir()) if root.is_dir() else []
    files, labels = [], []
    for label, name in enumerate(classes):
        mine = sorted(f for f in (root / name).iterdir() if f.suffix.lower() in IMAGE_SUFFIXES)[:per_class]
        files.extend(mine)
        labels.extend([label] * len(mine))
    return classes, files, labels


def _read_image_folder(split_dir: Path, per_class: int | None) -> ImageSet:
    import numpy as np
    from PIL import Image

    classes, files, labels = _class_files(split_dir, per_class)
    if not classes:
        raise FileNotFoundError(f"{split_dir} has no class folders (expected {split_dir}/<class>/<image>)")
    images = []
    for f in files:
        with Image.open(f) as img:
            images.append(np.asarray(img.convert("RGB")))
    if not images:
        raise FileNotFoundError(f"{split_dir} has class folders but no images ({', '.join(IMAGE_SUFFIXES)})")
    sizes = {im.shape for im in images}
    if len(sizes) != 1:
        raise ValueError(f"{split_dir}: images differ in size ({sorted(sizes)[:3]}); resize them to one size first")
    return ImageSet(torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).contiguous(),
                    torch.tensor(labels, dtype=torch.int64), classes, f"image folder {shown_path(split_dir)}")


def _first_per_class(labels: torch.Tensor, per_class: int | None) -> torch.Tensor:
    if per_class is None:
        return torch.arange(len(labels))
    keep = [torch.nonzero(labels == k).flatten()[:per_class] for k in labels.unique()]
    return torch.cat(keep).sort().values


def load_cifar10(split: str = "train", root: str | Path | None = None, *, download: bool = True,
                 per_class: int | None = None) -> ImageSet:
    """CIFAR-10 as an ``ImageSet``, from (1) an image-folder tree, (2) torchvision's copy, or (3) its download.

    ``root`` (or ``$COURSE_CIFAR10_DIR``) may be an image-folder tree ``train/<class>/*``, ``test/<class>/*``
    (MATLAB ``imageDatastore(..., LabelSource="foldernames")``) or a folder holding torchvision's
    ``cifar-10-batches-py``. Without one, ``data/cifar10`` of the checkout (outside one, the user's cache) is used
    and, if empty, downloaded when ``download`` is True (given up after ``DOWNLOAD_TIMEOUT_S`` without progress).
    ``per_class`` keeps the first N images of each class (notebook 05).
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', not {split!r}")
    given = root or os.environ.get("COURSE_CIFAR10_DIR")
    base = Path(given).expanduser() if given else _download_dir()
    if given and not base.exists():
        raise FileNotFoundError(f"CIFAR-10 folder {base} does not exist (from "
                                f"{'the cifar10_dir argument' if root else 'COURSE_CIFAR10_DIR'}); fix the path")
    tree = _folder_root(base) if base.exists() else None
    if tree is not None:
        data = _read_image_folder(tree / split, per_class)
        if len(data.classes) != 10:
            raise ValueError(f"{tree / split} has {len(data.classes)} class folders, CIFAR-10 has 10")
        return data
    import torchvision

    have = (base / "cifar-10-batches-py").is_dir()
    if not have and (given or not download):
        raise FileNotFoundError(
            f"no CIFAR-10 at {base}: expected an image-folder tree train/<class>/*, test/<class>/* or torchvision's "
            "cifar-10-batches-py. Point COURSE_CIFAR10_DIR (or the notebook's cifar10_dir) at one, or allow the download.")
    try:
        with _socket_timeout(DOWNLOAD_TIMEOUT_S):  # a download that stalls this long is given up
            ds = torchvision.datasets.CIFAR10(str(base), train=split == "train", download=not have)
    except Exception as exc:  # offline: URLError, socket timeout, a bad checksum, ...
        for part in base.glob("cifar-10-python.tar.gz*"):
            part.unlink()  # leave nothing half-written
        if base.is_dir() and not any(base.iterdir()):
            base.rmdir()
        kaggle = ("On Kaggle without internet: attach a CIFAR-10 image-folder data set (Add Input) and set "
                  "COURSE_CIFAR10_DIR to its folder under /kaggle/input. ") if os.environ.get(KAGGLE_ENV) else ""
        raise FileNotFoundError(
            f"CIFAR-10 is not in {base} and could not be downloaded ({type(exc).__name__}: {str(exc)[:120]}). "
            f"{kaggle}Offline? Point COURSE_CIFAR10_DIR (or the notebook's cifar10_dir) at an image-folder tree "
            "train/<class>/*, test/<class>/*.") from None
    labels = torch.tensor(ds.targets, dtype=torch.int64)
    keep = _first_per_class(labels, per_class)
    images = torch.from_numpy(ds.data).permute(0, 3, 1, 2).contiguous()[keep]
    return ImageSet(images, labels[keep], list(ds.classes), f"torchvision CIFAR10 in {base}")


DOWNLOAD_TIMEOUT_S = 30  # seconds without a byte before the CIFAR-10 download is given up
KAGGLE_ENV = "KAGGLE_KERNEL_RUN_TYPE"  # set in Kaggle's notebooks


def _download_dir() -> Path:
    """Where torchvision's CIFAR-10 is kept: ``data/cifar10`` in a checkout, else the user's cache (never the
    installed package's folder)."""
    return (project_root() / "data" if in_checkout() else cache_dir()) / "cifar10"


@contextlib.contextmanager
def _socket_timeout(seconds: float):
    """Every socket opened inside gives up after ``seconds`` without progress (torchvision's download sets none)."""
    before = socket.getdefaulttimeout()
    socket.setdefaulttimeout(seconds)
    try:
        yield
    finally:
        socket.setdefaulttimeout(before)


def synthetic_images(n: int, n_classes: int = 10, seed: int = 0, size: int = 32, noise_seed: int | None = None) -> ImageSet:
    """A small learnable stand-in for CIFAR-10 (class colour patterns from ``seed`` plus noise): NOT real data.
    (notebooks 05, 10)"""
    patterns = torch.rand(n_classes, 3, size, size, generator=torch.Generator().manual_seed(seed))
    g = torch.Generator().manual_seed(seed + 1 if noise_seed is None else 1000 + noise_seed)
    labels = torch.arange(n) % n_classes
    images = (0.55 * patterns[labels] + 0.45 * torch.rand(n, 3, size, size, generator=g)) * 255
    return ImageSet(images.to(torch.uint8), labels, [f"class {k}" for k in range(n_classes)],
                    "synthetic stand-in (random patterns, NOT CIFAR-10)")


def cifar10_transform(train: bool):
    """``transforms.v2`` pipeline on ``uint8`` tensors: random 4-pixel-padded crop + flip when training, normalise.
    (notebooks 04, 06, 07)

    Without training, only ``normalize``: torchvision is not imported (2 s of every DDP worker's start on a CPU).
    """
    if not train:
        return normalize_image
    from torchvision.transforms import v2

    steps = [v2.RandomCrop(32, padding=4), v2.RandomHorizontalFlip()] if train else []
    return v2.Compose(steps + [v2.ToDtype(torch.float32, scale=True), v2.Normalize(CIFAR10_MEAN, CIFAR10_STD)])


class ImageTensorDataset(Dataset):
    """Items ``(transform(image), label)`` from an ``ImageSet``'s in-memory ``uint8`` images (notebooks 04, 06, 07)."""

    def __init__(self, data: ImageSet, transform=None):
        self.data, self.transform = data, transform

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i):
        img = self.data.images[i]
        return (self.transform(img) if self.transform else img.float() / 255), self.data.labels[i]


def cifar10_or_standin(quick: bool, cifar10_dir=None, per_class: tuple = (None, None)) -> tuple:
    """``(train, test, note)``: CIFAR-10 as ``load_cifar10`` finds it; in quick mode only, a synthetic stand-in
    when it is missing, with ``note`` saying so (``None`` for the real data). Full mode raises the clear error.
    (notebooks 04-07, 09)"""
    try:
        return (load_cifar10("train", cifar10_dir, per_class=per_class[0]),
                load_cifar10("test", cifar10_dir, per_class=per_class[1]), None)
    except FileNotFoundError as err:
        if not quick:
            raise
        n_train, n_test = 10 * (per_class[0] or 100), 10 * (per_class[1] or 50)
        note = (f"**CIFAR-10 not found — using a synthetic stand-in (NOT CIFAR-10) for this quick run.** Accuracies "
                f"below say nothing about CIFAR-10. Reason: {err}")
        return synthetic_images(n_train), synthetic_images(n_test, noise_seed=1), note


def crop_flip(images: torch.Tensor, *, padding: int = 4, generator: torch.Generator | None = None) -> torch.Tensor:
    """Random ±``padding``-pixel translation (zero fill) and horizontal flip of a ``uint8`` batch, on its device.
    (notebook 04)

    MATLAB's ``RandXTranslation=[-4 4]`` with ``RandXReflection``, for the whole batch in two ``gather`` calls:
    one picks each image's rows, one its columns (reversed when flipped). Two kernels on a GPU, whatever the batch
    size; quick on a CPU too. Draws come from ``generator`` (on any device).
    """
    n, c, h, w = images.shape
    dev, span = images.device, 2 * padding + 1
    gdev = generator.device if generator is not None else dev
    dy, dx = torch.randint(0, span, (2, n), generator=generator, device=gdev).to(dev)
    flip = (torch.rand(n, generator=generator, device=gdev) < 0.5).to(dev)
    padded = torch.nn.functional.pad(images, (padding,) * 4)
    rows = dy[:, None] + torch.arange(h, device=dev)                      # (n, h): rows dy .. dy+h-1
    cols = dx[:, None] + torch.arange(w, device=dev)                      # (n, w)
    cols = torch.where(flip[:, None], cols.flip(1), cols)                 # a flip reads the columns backwards
    out = padded.gather(2, rows[:, None, :, None].expand(n, c, h, w + 2 * padding))
    return out.gather(3, cols[:, None, None, :].expand(n, c, h, w))


def normalize(images: torch.Tensor) -> torch.Tensor:
    """``uint8`` images to float32 with CIFAR-10's mean and standard deviation per channel (notebook 04)."""
    c = images.shape[1]
    std = torch.tensor(CIFAR10_STD, device=images.device).view(1, c, 1, 1)
    mean = torch.tensor(CIFAR10_MEAN, device=images.device).view(1, c, 1, 1)
    return images.float().mul_(1 / (255 * std)).sub_(mean / std)  # (x/255 - mean)/std in two passes


def normalize_image(image: torch.Tensor) -> torch.Tensor:
    """One ``uint8`` image (channels, height, width) normalised as ``normalize`` does a batch (notebooks 05-07)."""
    return normalize(image[None])[0]


def batch_augment(images: torch.Tensor, *, padding: int = 4, generator: torch.Generator | None = None) -> torch.Tensor:
    """Random crop and flip of a whole ``uint8`` batch on its own device, normalised to float32 (notebook 04).

    The same augmentation as ``cifar10_transform(train=True)``, as batched tensor operations (``crop_flip``)
    instead of a Python call per image, so it can run on the GPU when the CPU cannot keep up.
    """
    return normalize(crop_flip(images, padding=padding, generator=generator))


class DeviceLoader:
    """The whole image set on the device as ``uint8`` (CIFAR-10's 50,000 images: 150 MB), batches made there.

    A drop-in for a ``DataLoader`` in ``fit``: each epoch a permutation (the same on every rank, like
    ``DistributedSampler``: ``rank`` takes every ``world``-th index), then per batch an index gather, crop
    (±``padding`` pixels) + flip with a generator on the device (seeded from ``seed``, ``rank`` and the epoch: every
    rank draws *different* augmentation, and an epoch replays identically on resume), normalisation, optional
    channels-last. No worker processes and no host-to-device copy per step, so the GPU, not the CPU, sets the pace
    (notebooks 04-07).
    """

    def __init__(self, data: "ImageSet", batch_size: int, *, device="cpu", augment: bool = True,
                 shuffle: bool = True, seed: int = 0, rank: int = 0, world: int = 1, channels_last: bool = False,
                 drop_last: bool = False, padding: int = 4):
        self.device = torch.device(device)
        self.images, self.labels = data.images.to(self.device), data.labels.to(self.device)
        self.batch_size, self.augment, self.shuffle, self.seed = batch_size, augment, shuffle, seed
        self.rank, self.world, self.channels_last, self.drop_last = rank, world, channels_last, drop_last
        self.padding = padding
        self.epoch = 0
        self.dataset = data  # what len(loader.dataset) reports, as for a DataLoader

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _indices(self) -> torch.Tensor:
        n = len(self.labels)
        order = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed + self.epoch)) if self.shuffle \
            else torch.arange(n)
        per_rank = -(-n // self.world)
        order = torch.cat([order, order[:per_rank * self.world - n]])  # pad so every rank has as many
        return order[self.rank::self.world].to(self.device)

    def __len__(self) -> int:
        per_rank = -(-len(self.labels) // self.world)
        return per_rank // self.batch_size if self.drop_last else -(-per_rank // self.batch_size)

    def __iter__(self):
        mine = self._indices()
        gen = torch.Generator(device=self.device).manual_seed(hash((self.seed, self.rank, self.epoch)) % 2**62)
        for b in range(len(self)):
            idx = mine[b * self.batch_size:(b + 1) * self.batch_size]
            x = self.images[idx]
            x = normalize(crop_flip(x, padding=self.padding, generator=gen) if self.augment else x)
            if self.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            yield x, self.labels[idx]


def input_images_per_s(loader, batches: int = 20) -> float:
    """Images per second the input pipeline alone delivers (``loader`` iterated, no model), synchronised.
    (notebooks 05-07)"""
    it, seen = iter(loader), 0
    x, _ = next(it)  # start-up (workers, first gather) is not throughput
    device = x.device
    synchronize(device)
    t0 = time.perf_counter()
    for _ in range(batches):
        try:
            x, _ = next(it)
        except StopIteration:
            break
        seen += x.shape[0]
    synchronize(device)
    return seen / max(time.perf_counter() - t0, 1e-9)


class FileImageDataset(Dataset):
    """Items ``(transform(decoded image file), label)``: the image-folder pipeline that reads and decodes a file per
    image, as torchvision's ``ImageFolder`` or MATLAB's ``imageDatastore`` do (notebook 10)."""

    def __init__(self, files: list, labels: list, transform=None):
        self.files, self.labels, self.transform = files, labels, transform

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i):
        from torchvision.io import decode_image

        img = decode_image(str(self.files[i]))
        return (self.transform(img) if self.transform else img), self.labels[i]


def image_files(cifar10_dir, per_class: int, scratch: Path) -> tuple[FileImageDataset, str]:
    """``per_class`` training images of each class as files (CIFAR-10's own when an image-folder tree is found,
    else synthetic PNGs written under ``scratch``), and where they came from (notebook 10)."""
    given = cifar10_dir or os.environ.get("COURSE_CIFAR10_DIR")
    tree = _folder_root(Path(given)) if given and Path(given).exists() else None
    if tree is None:
        from torchvision.io import write_png

        data = synthetic_images(10 * per_class)
        for i, (img, label) in enumerate(zip(data.images, data.labels)):
            (scratch / str(int(label))).mkdir(parents=True, exist_ok=True)
            write_png(img, str(scratch / str(int(label)) / f"{i}.png"))
    root = tree / "train" if tree else scratch
    _, files, labels = _class_files(root, per_class)
    source = (f"CIFAR-10 image files in {shown_path(root)}" if tree else
              f"synthetic PNG files in {shown_path(root)} (no CIFAR-10 image folder here)")
    return FileImageDataset(files, labels, cifar10_transform(train=True)), source
