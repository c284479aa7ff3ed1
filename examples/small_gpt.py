"""Lesson 11's small GPT as a script for the command line of lesson 10:

    python -m helpers.diagnose examples/small_gpt.py --budget-s 60

Characters of Tiny Shakespeare (``data/tinyshakespeare.txt``) in non-overlapping windows, a 4-block GPT,
AdamW. Copy it and replace the three functions with your own model, data and optimizer.
"""
from functools import lru_cache

import torch
from torch.utils.data import DataLoader

from helpers import gpt

SEQ_LEN, BATCH = 128, 32          # lesson 11's CPU size
loss_fn = gpt.lm_loss             # cross-entropy over every position of (batch, time, vocab) logits


@lru_cache(maxsize=1)
def _tokens() -> tuple[torch.Tensor, int]:
    text = gpt.load_corpus()
    tok = gpt.CharTokens.fit(text)
    train, _ = gpt.split(tok.encode(text))
    return train, len(tok.chars)


def make_model():
    torch.manual_seed(0)
    return gpt.GPT(gpt.GPTConfig(vocab=_tokens()[1], seq_len=SEQ_LEN, d_model=128, n_layers=4, n_heads=4))


def make_loader():
    return DataLoader(gpt.TokenWindows(_tokens()[0], SEQ_LEN), batch_size=BATCH, shuffle=True)


def make_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=3e-3)
