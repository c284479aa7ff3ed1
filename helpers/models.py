"""Models used across the lessons (notebook 01: the sequence classifier)."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence


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
