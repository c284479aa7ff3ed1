"""Overhead-bound: a small, deep MLP on tabular data at a tiny batch.

Twelve narrow layers: about 400 small operators a step, against which the DataLoader's own cost per batch (about
0.2 ms on a 2-core CPU) is some 6 % of the step. With two layers it was about 15 %, between the input and overhead
readings, and the verdict followed the machine's noise.
"""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def make_model():
    torch.manual_seed(0)
    hidden = [layer for _ in range(10) for layer in (nn.Linear(64, 64), nn.ReLU())]
    return nn.Sequential(nn.Linear(20, 64), nn.ReLU(), *hidden, nn.Linear(64, 2))


def make_loader():
    x = torch.randn(4096, 20)
    y = (x[:, 0] + x[:, 1] > 0).long()
    return DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)


def make_optimizer(model):
    return torch.optim.Adam(model.parameters(), lr=1e-3)
