"""Input-bound: an image folder of JPEG files, decoded and augmented image by image with PIL, no loader workers
(torchvision's ImageFolder, as most tutorials write it), feeding a small CNN. The folder is ``$WORKLOAD_IMAGES``,
else small JPEGs written once with PIL under the temporary directory (``write_jpegs``)."""
import os
import tempfile
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader
from torchvision import datasets, transforms


SIZE = 384  # pixels a side, a photo's: decoding and augmenting it cost more than the model's step, busy machine or not


def write_jpegs(root, per_class: int = 24, classes: int = 4, size: int = SIZE) -> Path:
    """``classes`` folders of ``per_class`` JPEGs (smooth colour fields with noise, like photos), written once."""
    from PIL import Image

    root = Path(root)
    if len(list(root.glob("*/*.jpg"))) == per_class * classes:
        return root
    g = torch.Generator().manual_seed(0)
    ramp = torch.linspace(0, 1, size)
    for c in range(classes):
        (root / f"class{c}").mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            base = torch.rand(3, 1, 1, generator=g) * ramp.view(1, -1, 1) + torch.rand(3, 1, 1, generator=g) * ramp
            img = (base / 2 + 0.15 * torch.rand(3, size, size, generator=g)).clamp(0, 1)
            Image.fromarray((img * 255).byte().permute(1, 2, 0).numpy()).save(root / f"class{c}" / f"{i}.jpg",
                                                                                quality=90)
    return root


def make_loader():
    root = os.environ.get("WORKLOAD_IMAGES") or write_jpegs(Path(tempfile.gettempdir()) / f"workload-jpegs-{SIZE}")
    augment = transforms.Compose([
        transforms.ColorJitter(0.4, 0.4, 0.4),  # on the whole photo, as many tutorials order it
        transforms.RandomResizedCrop(56, scale=(0.6, 1.0)),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize((0.5, 0.5, 0.5), (0.25, 0.25, 0.25)),
    ])
    return DataLoader(datasets.ImageFolder(root, transform=augment), batch_size=32, shuffle=True, num_workers=0)


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(32, 4))


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
