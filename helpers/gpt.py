"""A small GPT written plainly: characters in, a decoder-only transformer, characters out (notebook 11).

The model is the one the GPT papers and nanoGPT describe, without their options: token + position embedding,
pre-norm blocks (LayerNorm → causal self-attention through ``F.scaled_dot_product_attention`` → residual,
LayerNorm → MLP → residual), a final LayerNorm and an output matrix tied to the token embedding. The corpus is
Tiny Shakespeare (``data/tinyshakespeare.txt``, public domain; see ``data/README.md``), one token per character.
"""
from __future__ import annotations

import hashlib
import math
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from .devices import half_precision
from .profiling import peak_mb, tensor_mb
from .results import course_file
from .timing import time_fn

CORPUS = "tinyshakespeare.txt"
CORPUS_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"


# ---------------------------------------------------------------- the corpus and its tokens

def load_corpus(path=None, *, verify: bool = True) -> str:
    """The corpus text (``data/tinyshakespeare.txt`` unless ``path``), its SHA-256 checked (notebook 11)."""
    path = path or course_file("data", CORPUS)
    raw = Path(path).read_bytes()
    if verify and hashlib.sha256(raw).hexdigest() != CORPUS_SHA256:
        raise ValueError(f"{path}: SHA-256 differs from data/SHA256SUMS (the file was changed or truncated)")
    return raw.decode("utf-8")


@dataclass
class CharTokens:
    """Character-level tokens: the sorted characters of a text are its vocabulary (notebook 11)."""

    chars: str

    @classmethod
    def fit(cls, text: str) -> CharTokens:
        return cls("".join(sorted(set(text))))

    def encode(self, text: str) -> torch.Tensor:
        index = {c: i for i, c in enumerate(self.chars)}
        return torch.tensor([index[c] for c in text], dtype=torch.long)

    def decode(self, ids) -> str:
        return "".join(self.chars[i] for i in torch.as_tensor(ids).tolist())


def split(tokens: torch.Tensor, val_fraction: float = 0.1) -> tuple[torch.Tensor, torch.Tensor]:
    """Contiguous train / validation split: the first ``1 - val_fraction`` of the tokens, then the rest. No window
    drawn from one part overlaps the other (notebook 11)."""
    cut = int(len(tokens) * (1 - val_fraction))
    return tokens[:cut], tokens[cut:]


def unigram_entropy(tokens: torch.Tensor) -> float:
    """Entropy (nats per token) of the tokens' frequencies: the best context-blind model's loss (notebook 11)."""
    p = torch.bincount(tokens).double()
    p = p[p > 0] / p.sum()
    return float(-(p * p.log()).sum())


def windows(tokens: torch.Tensor, batch_size: int, seq_len: int, generator=None) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of random windows from ``tokens``: inputs ``(B, T)`` and the next tokens ``(B, T)`` as targets.
    (notebook 11)"""
    start = torch.randint(len(tokens) - seq_len - 1, (batch_size,), generator=generator)
    x = torch.stack([tokens[s:s + seq_len] for s in start.tolist()])
    y = torch.stack([tokens[s + 1:s + seq_len + 1] for s in start.tolist()])
    return x, y


class TokenWindows(torch.utils.data.Dataset):
    """Non-overlapping windows of ``tokens`` as a ``Dataset`` for a ``DataLoader`` (notebook 10 diagnoses the GPT
    this way): item ``i`` is the ``seq_len`` tokens from ``i × seq_len`` and the same window shifted by one."""

    def __init__(self, tokens: torch.Tensor, seq_len: int):
        if len(tokens) < seq_len + 1:
            raise ValueError(f"{len(tokens)} tokens make no window of {seq_len} + 1: use a shorter seq_len")
        self.tokens, self.seq_len = tokens, seq_len

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.seq_len

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= i < len(self):
            raise IndexError(i)
        s = i * self.seq_len
        return self.tokens[s:s + self.seq_len], self.tokens[s + 1:s + self.seq_len + 1]


# ---------------------------------------------------------------- the model

@dataclass
class GPTConfig:
    """The model's sizes (notebook 11's size table)."""

    vocab: int = 65
    seq_len: int = 128
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    checkpoint: bool = False  # recompute each block's activations in the backward pass (memory for time)


def manual_attention(q, k, v) -> torch.Tensor:
    """Causal attention written out: softmax(q kᵀ / √d + mask) v, the (T × T) scores materialised (notebook 11)."""
    t = q.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    return scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v


def sdpa_attention(q, k, v) -> torch.Tensor:
    """Causal attention through PyTorch's fused ``scaled_dot_product_attention`` (it picks a backend) (notebook 11)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention: one matmul makes q, k and v; ``attend`` is swappable (notebook 11)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.heads, self.attend = cfg.n_heads, sdpa_attention
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in self.qkv(x).split(d, dim=2))
        return self.proj(self.attend(q, k, v).transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    """A pre-norm transformer block: x + attention(LN(x)), then x + MLP(LN(x)) (notebook 11)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(cfg.d_model), CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, 4 * cfg.d_model), nn.GELU(),
                                 nn.Linear(4 * cfg.d_model, cfg.d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Decoder-only transformer: ``forward(idx (B, T)) → logits (B, T, vocab)`` (notebook 11)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        self.head.weight = self.tok.weight  # weight tying: one matrix embeds and un-embeds
        self.apply(_init)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.cfg.checkpoint and self.training else block(x)
        return self.head(self.ln_f(x))


def _init(m: nn.Module) -> None:
    if isinstance(m, (nn.Linear, nn.Embedding)):
        nn.init.normal_(m.weight, std=0.02)
    if isinstance(m, nn.Linear) and m.bias is not None:
        nn.init.zeros_(m.bias)


class ForCrossEntropy(nn.Module):
    """``model``'s logits as ``(B, vocab, T)``, the layout ``nn.CrossEntropyLoss`` takes for targets ``(B, T)``, so
    the course's step tools (``timing.time_train_step``, ``counting.count_step``, ``compiling.compare_compiled``)
    train the GPT unchanged. ``transpose`` is a view: no copy (notebook 11)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(idx).transpose(1, 2)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy (nats per token) of logits ``(B, T, V)`` against the next tokens ``(B, T)`` (notebook 11)."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


# ---------------------------------------------------------------- counting: parameters, FLOPs, bytes

def parameters(model: GPT) -> dict:
    """Parameter counts: ``total`` (the tied matrix once), ``embedding`` (token + position tables) and
    ``non_embedding`` (the blocks and the final LayerNorm) (notebook 11)."""
    total = sum(p.numel() for p in model.parameters())  # .parameters() yields a tied tensor once
    embedding = model.tok.weight.numel() + model.pos.weight.numel()
    return {"total": total, "embedding": embedding, "non_embedding": total - embedding}


def flops_per_token(cfg: GPTConfig, n_non_embedding: int) -> dict:
    """Training FLOPs per token from the standard formula (Kaplan et al. 2020, PaLM appendix B; notebook 11).

    ``6 N``: a weight used in a matmul costs 2 FLOPs per token forward and 4 backward; N is the non-embedding
    parameters plus the tied output matrix (a lookup costs no FLOPs, the output projection is a matmul).
    ``attention``: ``12 L T d``, the q kᵀ and (scores) v products over the full T × T square forward (4 T d per
    layer) and twice that backward, as the kernels compute it; a causal mask makes half of it wasted work."""
    n = n_non_embedding + cfg.vocab * cfg.d_model
    attention = 12 * cfg.n_layers * cfg.seq_len * cfg.d_model
    return {"params_term": 6 * n, "attention_term": attention, "total": 6 * n + attention, "n_counted": n}


def memory_prediction(cfg: GPTConfig, batch_size: int, n_params: int, accumulate: int = 1) -> dict:
    """Predicted bytes of a training step with AdamW (notebook 11): weights, gradients, AdamW's two moments, and the
    activations the backward pass keeps, per block and for the head.

    Per token a block keeps 17 d values: LN1's input and output (2 d), q, k, v (3 d), the attention output and its
    contiguous copy (2 d), LN2's input and output (2 d), the MLP's hidden layer before and after GELU (8 d); the
    attention's log-sum-exp (one value per head) is small and counted. The head keeps the final LayerNorm's input
    and output (2 d), the logits and their log-softmax (2 V). Checkpointing keeps each block's input (d) instead.
    ``peak``: live when the forward pass ends: weights, AdamW state, activations, and gradients if ``accumulate`` > 1.
    """
    tokens, d, v = batch_size * cfg.seq_len, cfg.d_model, cfg.vocab
    full_block = (17 * d + cfg.n_heads) * tokens * 4  # fp32 values
    per_block = d * tokens * 4 if cfg.checkpoint else full_block
    weights = n_params * 4
    found = {"params": weights, "grads": weights, "adamw_states": 2 * weights, "activations_per_block": per_block,
             "activations": per_block * cfg.n_layers + (2 * d + 2 * v) * tokens * 4}
    # the peak: at the end of the forward pass, before any gradient exists (zero_grad(set_to_none=True)) unless an
    # earlier micro-batch left them; under checkpointing the backward pass rebuilds one block's activations on top
    found["peak"] = (weights + found["adamw_states"] + found["activations"] + (full_block if cfg.checkpoint else 0)
                     + (found["grads"] if accumulate > 1 else 0))
    return found


# ---------------------------------------------------------------- training, evaluation, sampling

@torch.no_grad()
def evaluate(model: GPT, tokens: torch.Tensor, *, batch_size: int = 32, batches: int = 10, device="cpu",
             seed: int = 0) -> float:
    """Mean loss (nats per token) on ``batches`` random windows of ``tokens`` (fixed by ``seed``) (notebook 11)."""
    was, g = model.training, torch.Generator().manual_seed(seed)
    model.eval()
    total = 0.0
    for _ in range(batches):
        x, y = (t.to(device) for t in windows(tokens, batch_size, model.cfg.seq_len, g))
        total += lm_loss(model(x), y).item()
    model.train(was)
    return total / batches


def train(model: GPT, train_tokens, val_tokens, *, steps: int, batch_size: int, lr: float = 3e-3, device="cpu",
          time_limit_s: float | None = None, eval_every: int = 100) -> dict:
    """Train with AdamW and a cosine schedule (warm-up 5 %) for ``steps`` or until ``time_limit_s`` (notebook 11).

    The schedule follows the clock when a time limit is set, so a stopped run still ends at a low rate. Returns the
    history: step, seconds, train and validation loss, and ``tokens_per_s`` over the training time (evaluation
    excluded).
    """
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.1)
    g, t0, spent, hist = torch.Generator().manual_seed(0), time.perf_counter(), 0.0, []
    model.to(device).train()
    for step in range(1, steps + 1):
        done = max(step / steps, spent / time_limit_s if time_limit_s else 0.0)
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, done / 0.05) * 0.5 * (1 + math.cos(math.pi * min(done, 1.0)))
        tick = time.perf_counter()
        x, y = (t.to(device) for t in windows(train_tokens, batch_size, model.cfg.seq_len, g))
        loss = lm_loss(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        spent += time.perf_counter() - tick
        last = step == steps or (time_limit_s is not None and spent >= time_limit_s)
        if step % eval_every == 0 or last:
            hist.append({"step": step, "seconds": spent, "train_loss": loss.item(),
                         "val_loss": evaluate(model, val_tokens, device=device)})
        if last:
            break
    tokens = step * batch_size * model.cfg.seq_len
    return {"history": hist, "steps": step, "tokens": tokens, "train_s": spent, "tokens_per_s": tokens / spent,
            "wall_s": time.perf_counter() - t0, "config": asdict(model.cfg)}


@torch.no_grad()
def generate(model: GPT, prompt: torch.Tensor, new_tokens: int, *, temperature: float = 0.8, top_k: int = 20,
             seed: int = 0) -> torch.Tensor:
    """Continue ``prompt`` (1-D token ids) by ``new_tokens`` sampled ones (top-k sampling, fixed ``seed``).
    (notebook 11)"""
    g, was = torch.Generator().manual_seed(seed), model.training
    model.eval()
    device = next(model.parameters()).device
    ids = prompt.to(device)
    for _ in range(new_tokens):
        logits = model(ids[-model.cfg.seq_len:][None])[0, -1].float().cpu() / temperature
        cut = logits.topk(min(top_k, logits.numel())).values[-1]
        probs = logits.masked_fill(logits < cut, float("-inf")).softmax(-1)
        ids = torch.cat([ids, torch.multinomial(probs, 1, generator=g).to(device)])
    model.train(was)
    return ids.cpu()


# ---------------------------------------------------------------- attention kernels and the step's memory

def attention_backends(device) -> list:
    """The SDPA backends worth timing on ``device``: math and flash everywhere (the CPU has a flash-style kernel),
    memory-efficient and cuDNN on CUDA only (notebook 11)."""
    from torch.nn.attention import SDPBackend

    names = ["MATH", "FLASH_ATTENTION"] + (["EFFICIENT_ATTENTION", "CUDNN_ATTENTION"]
                                          if torch.device(device).type == "cuda" else [])
    return [getattr(SDPBackend, n) for n in names if hasattr(SDPBackend, n)]


def attention_dtype(device) -> torch.dtype:
    """The dtype attention is timed in: a CUDA GPU's native half precision (``helpers.devices.half_precision``), fp32
    elsewhere (notebook 11)."""
    return half_precision(device) if torch.device(device).type == "cuda" else torch.float32


def time_attention(batch: int, heads: int, seq_len: int, head_dim: int, device="cpu", *, dtype=None,
                   min_run_time: float = 0.2) -> dict:
    """Forward + backward of causal attention per SDPA backend and hand-written: ms and peak MB (notebook 11).

    ``dtype`` None: ``attention_dtype`` (the flash and cuDNN kernels take no fp32). Each row records its ``dtype``;
    a backend that cannot run these inputs (wrong device, dtype or shape) records its error instead.
    """
    from torch.nn.attention import sdpa_kernel

    dtype = dtype or attention_dtype(device)
    q, k, v = (torch.randn(batch, heads, seq_len, head_dim, device=device, dtype=dtype, requires_grad=True)
               for _ in range(3))
    found = {}
    for name, backend in [("hand-written", None)] + [(b.name.lower(), b) for b in attention_backends(device)]:
        attend = manual_attention if backend is None else sdpa_attention

        def step(backend=backend, attend=attend):
            with sdpa_kernel(backend) if backend is not None else nullcontext():
                attend(q, k, v).sum().backward()

        try:
            ms = time_fn(step, device, min_run_time=min_run_time).median_s * 1e3
            found[name] = {"ms": ms, "peak_mb": peak_mb(step, device), "dtype": str(dtype).removeprefix("torch.")}
        except RuntimeError as exc:
            found[name] = {"error": str(exc).splitlines()[0][:160], "dtype": str(dtype).removeprefix("torch.")}
    return found


def step_cost(cfg: GPTConfig, batch_size: int, device="cpu", *, accumulate: int = 1, amp_dtype=None,
              optimizer_kw: dict | None = None, min_run_time: float = 0.2, seed: int = 0) -> dict:
    """One AdamW training step of a fresh ``GPT(cfg)`` on random tokens: ms, tokens/s, and peak MB of the whole
    step (weights, AdamW state and what the step allocates: ``peak_mb``), with ``batch_size`` split into
    ``accumulate`` micro-batches (notebook 11). The optimizer's state exists before the measurement (one step first).
    """
    torch.manual_seed(seed)
    model = GPT(cfg).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **(optimizer_kw or {}))
    x = torch.randint(0, cfg.vocab, (accumulate, batch_size // accumulate, cfg.seq_len), device=device)
    y = torch.roll(x, -1, dims=2)

    def step():
        for i in range(accumulate):
            with torch.autocast(torch.device(device).type, dtype=amp_dtype, enabled=amp_dtype is not None):
                loss = lm_loss(model(x[i]).float(), y[i]) / accumulate
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    seconds = time_fn(step, device, warmup=1, min_run_time=min_run_time).median_s
    peak = peak_mb(step, device, held=(model, opt))
    return {"ms": seconds * 1e3, "tokens_per_s": batch_size * cfg.seq_len / seconds, "peak_mb": peak,
            "held_mb": tensor_mb(model, opt), "batch": batch_size, "accumulate": accumulate}


def memory_snapshot(cfg: GPTConfig, batch_size: int, device, path, *, steps: int = 3) -> dict:
    """Record CUDA's allocator history over ``steps`` AdamW steps of a fresh ``GPT(cfg)`` and save the snapshot
    (``torch.cuda.memory._dump_snapshot``, a pickle that https://pytorch.org/memory_viz opens) to ``path``; returns
    the snapshot's data (notebook 11). CUDA only."""
    import pickle

    model = GPT(cfg).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, cfg.vocab, (batch_size, cfg.seq_len), device=device)
    # Python frames only: symbolising C++ frames ("all", the default) has taken minutes (torchtitan#3628)
    torch.cuda.memory._record_memory_history(max_entries=200_000, stacks="python")
    try:
        for _ in range(steps):
            lm_loss(model(x), torch.roll(x, -1, 1)).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize(device)
        torch.cuda.memory._dump_snapshot(str(path))
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    with open(path, "rb") as fh:
        return pickle.load(fh)  # the file this function has just written


def snapshot_timeline(snapshot: dict) -> tuple[list, list]:
    """Live MB after each allocator event of a CUDA memory snapshot (``memory_snapshot``): the allocation timeline
    that PyTorch's memory viewer draws, from the snapshot's ``device_traces`` (notebook 11)."""
    live, xs, ys = 0, [], []
    for trace in snapshot.get("device_traces", []):
        for i, event in enumerate(trace):
            if event["action"] == "alloc":
                live += event["size"]
            elif event["action"] == "free_completed":
                live -= event["size"]
            else:
                continue
            xs.append(i)
            ys.append(live / 2**20)
    return xs, ys
