"""A small transformer language model (next-token prediction on a token stream), as a user would write it."""
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

VOCAB, CONTEXT = 256, 64


class Windows(Dataset):
    def __init__(self, tokens: torch.Tensor):
        self.tokens = tokens

    def __len__(self):
        return len(self.tokens) - CONTEXT - 1

    def __getitem__(self, i):
        chunk = self.tokens[i:i + CONTEXT + 1]
        return chunk[:-1], chunk[1:]


class TinyLM(nn.Module):
    def __init__(self, d: int = 192, heads: int = 4, layers: int = 2):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, d)
        self.pos = nn.Parameter(torch.zeros(CONTEXT, d))
        block = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers)
        self.out = nn.Linear(d, VOCAB)

    def forward(self, x):
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        h = self.blocks(self.embed(x) + self.pos[: x.shape[1]], mask=mask, is_causal=True)
        return self.out(h).transpose(1, 2)  # (batch, vocab, time) for cross-entropy over every position


def make_model():
    torch.manual_seed(0)
    return TinyLM()


def make_loader():
    g = torch.Generator().manual_seed(0)
    return DataLoader(Windows(torch.randint(0, VOCAB, (20_000,), generator=g)), batch_size=16, shuffle=True)


def make_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=3e-4)
