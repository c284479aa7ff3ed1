"""Models used across the lessons (notebook 01: the sequence classifier)."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence


def lstm_device(device: str | torch.device) -> torch.device:
    """Where to run the packed (Bi)LSTM: ``device``, except on Apple's MPS, where it runs on the CPU (notebook 01).

    Packed LSTMs on MPS have a history of silently wrong results and crashes in PyTorch (pytorch#95118: wrong
    output with a PackedSequence; #94754: wrong BiLSTM; #102911: packed sequences crash), so the course keeps them
    on the CPU there and says so rather than report numbers it cannot trust.
    """
    device = torch.device(device)
    return torch.device("cpu") if device.type == "mps" else device


class SequenceClassifier(nn.Module):
    """LSTM or BiLSTM over padded sequences, classified from each sequence's true last step (notebook 01).

    MATLAB: ``sequenceInputLayer(F)``, ``lstmLayer(H, OutputMode="last")`` (or ``bilstmLayer``),
    ``fullyConnectedLayer(K)``, ``softmaxLayer`` (the softmax lives in ``nn.CrossEntropyLoss`` here).
    ``forward(x, lengths)`` takes ``x`` of shape ``(B, T_max, F)`` and ``lengths``, a CPU ``int64`` tensor.
    With packing, the final hidden state of the forward direction is the output at each sequence's own
    last step (never at a padded step); the backward direction's final state is its state at t = 0, after the
    whole sequence. MATLAB's ``OutputMode="last"`` takes the layer's output at the last time step instead, where
    the backward direction has read one element (notebook 01 says how to reproduce that).
    """

    def __init__(self, n_features: int, n_classes: int, hidden: int = 100, bidirectional: bool = False,
                 num_layers: int = 1, dropout: float = 0.0):
        super().__init__()
        self.lstm = nn.LSTM(n_features, hidden, num_layers=num_layers, batch_first=True,
                            bidirectional=bidirectional, dropout=dropout if num_layers > 1 else 0.0)
        self.head = nn.Linear(hidden * (2 if bidirectional else 1), n_classes)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        if lengths.device.type != "cpu":
            raise ValueError(f"lengths are on {lengths.device}, but pack_padded_sequence needs them as a CPU int64 "
                             "tensor: pass lengths.cpu(), or keep them on the host with fit(..., host_inputs=(1,))")
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        _, (h, _) = self.lstm(packed)  # h: (layers * directions, B, hidden), in the batch's original order
        last = torch.cat([h[-2], h[-1]], dim=1) if self.lstm.bidirectional else h[-1]
        return self.head(last)


class ConvBlockNet(nn.Module):
    """MATLAB's CIFAR-10 multi-GPU example network, parameterised (notebook 05).

    Three blocks of ``depth`` × (3×3 conv, "same" padding → batch norm → ReLU) with ``widths`` channels,
    2×2 max-pooling (stride 2) between blocks, global average pooling (8×8 for 32×32 inputs), one linear
    layer. ``batch_norm=False`` drops the batch norms (for checking DDP equivalence exactly).
    """

    def __init__(self, widths=(32, 64, 128), depth: int = 4, n_classes: int = 10, in_channels: int = 3,
                 batch_norm: bool = True):
        super().__init__()
        layers, channels = [], in_channels
        for b, width in enumerate(widths):
            if b > 0:
                layers.append(nn.MaxPool2d(2, stride=2))
            for _ in range(depth):
                layers.append(nn.Conv2d(channels, width, 3, padding=1, bias=not batch_norm))
                if batch_norm:
                    layers.append(nn.BatchNorm2d(width))
                layers.append(nn.ReLU(inplace=True))
                channels = width
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(channels, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean(dim=(2, 3)))


def whitening_filters(images: torch.Tensor, eps: float = 5e-4, patches: int = 200_000) -> torch.Tensor:
    """2×2 filters that whiten the 2×2 patches of ``images`` (normalised float, ``(N, 3, H, W)``) (notebook 05).

    The 12 values of a 2×2 RGB patch are strongly correlated (neighbouring pixels, three colour channels). With
    the eigenvectors ``v`` and eigenvalues ``λ`` of their covariance, the filters ``v / sqrt(λ + eps)`` turn a
    patch into 12 uncorrelated unit-variance features; the result stacks them with their negatives (24 filters),
    so a following GELU keeps both signs. A fixed random sample of ``patches`` patches estimates the covariance.
    """
    c = images.shape[1]
    p = images.float().unfold(2, 2, 1).unfold(3, 2, 1)            # (N, C, H-1, W-1, 2, 2)
    p = p.permute(0, 2, 3, 1, 4, 5).reshape(-1, c * 4)            # one row per patch
    if len(p) > patches:
        p = p[torch.randperm(len(p), generator=torch.Generator().manual_seed(0))[:patches]]
    values, vectors = torch.linalg.eigh(torch.cov(p.T))
    w = (vectors.T / torch.sqrt(values.clamp_min(0) + eps)[:, None]).reshape(c * 4, c, 2, 2)
    return torch.cat([w, -w])


class CompactNet(nn.Module):
    """A small, fast CIFAR-10 network for a fixed time budget: the improved recipe's network (notebook 05).

    After Keller Jordan's *airbench* ("94% on CIFAR-10 in 3.29 Seconds on a Single GPU", arXiv 2404.00498), which
    follows hlb-CIFAR10 and Page (2018): a frozen 2×2 *whitening* convolution (``init_whitening``; no padding,
    32→31 pixels) and GELU, then three blocks of (3×3 conv → 2×2 max-pool → batch norm → GELU → 3×3 conv →
    batch norm → GELU) with ``widths`` channels, a global max-pool and a linear layer whose logits are divided
    by 8. Its forward pass costs 40 MFLOP per 32×32 image, a fifth of ``ConvBlockNet``'s 190 (no layer runs at
    full resolution, and only the first block at 31×31).
    """

    def __init__(self, widths=(32, 64, 128), n_classes: int = 10, in_channels: int = 3):
        super().__init__()
        self.whiten = nn.Conv2d(in_channels, 8 * in_channels, 2)
        layers, channels = [nn.GELU()], 8 * in_channels
        for width in widths:
            layers += [nn.Conv2d(channels, width, 3, padding=1, bias=False), nn.MaxPool2d(2),
                       nn.BatchNorm2d(width, momentum=0.4), nn.GELU(),
                       nn.Conv2d(width, width, 3, padding=1, bias=False), nn.BatchNorm2d(width, momentum=0.4), nn.GELU()]
            channels = width
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(channels, n_classes, bias=False)

    def init_whitening(self, images: torch.Tensor) -> "CompactNet":
        """Set the first layer to ``whitening_filters(images)`` (normalised training images) and freeze it."""
        with torch.no_grad():
            self.whiten.weight.copy_(whitening_filters(images).to(self.whiten.weight))
            self.whiten.bias.zero_()
        self.whiten.weight.requires_grad_(False)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(self.whiten(x)).amax(dim=(2, 3))) / 8
