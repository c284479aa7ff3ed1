"""Compute-bound: a torchvision ResNet-18 for 10 classes, trained on images already in memory."""
import torch
import torchvision
from torch.utils.data import DataLoader, TensorDataset


def make_model():
    torch.manual_seed(0)
    return torchvision.models.resnet18(num_classes=10)


def make_loader():
    images = torch.randn(128, 3, 64, 64)
    labels = torch.randint(0, 10, (128,))
    return DataLoader(TensorDataset(images, labels), batch_size=16, shuffle=True)


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
