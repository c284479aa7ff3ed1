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
    last step (never at a padded step); the backward direction's final state summarises the whole sequence.
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
