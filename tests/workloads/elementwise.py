"""Memory-bound: a long chain of elementwise operations on large activations (a hand-written gated MLP with many
small elementwise steps and one small matrix product)."""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class ElementwiseChain(nn.Module):
    def __init__(self, width: int = 4096, depth: int = 12, classes: int = 10):
        super().__init__()
        self.scales = nn.Parameter(torch.ones(depth, width))
        self.shifts = nn.Parameter(torch.zeros(depth, width))
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        for scale, shift in zip(self.scales, self.shifts):
            x = torch.relu(x * scale + shift) + 0.5 * x
        return self.head(x)


def make_model():
    torch.manual_seed(0)
    return ElementwiseChain()


def make_loader():
    x = torch.randn(1024, 4096)
    y = torch.randint(0, 10, (1024,))
    return DataLoader(TensorDataset(x, y), batch_size=256, shuffle=True)


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.01)
