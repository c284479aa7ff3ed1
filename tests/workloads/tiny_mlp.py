"""Overhead-bound: a small MLP on tabular data at a tiny batch."""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))


def make_loader():
    x = torch.randn(4096, 20)
    y = (x[:, 0] + x[:, 1] > 0).long()
    return DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)


def make_optimizer(model):
    return torch.optim.Adam(model.parameters(), lr=1e-3)
