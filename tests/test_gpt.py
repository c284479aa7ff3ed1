"""helpers.gpt (notebook 11): the corpus and its split, shapes, a causal mask that is really causal, weight tying,
the FLOPs formula against a counted step, the memory prediction, and a model that learns."""
import hashlib
from pathlib import Path

import pytest
import torch

from helpers import gpt
from helpers.counting import count_step

ROOT = Path(__file__).resolve().parent.parent
SMALL = gpt.GPTConfig(vocab=65, seq_len=32, d_model=32, n_layers=2, n_heads=4)


@pytest.fixture(scope="module")
def tokens():
    text = gpt.load_corpus()
    return gpt.CharTokens.fit(text), text


def test_corpus_matches_its_checksum_and_sha256sums():
    raw = (ROOT / "data" / gpt.CORPUS).read_bytes()
    assert hashlib.sha256(raw).hexdigest() == gpt.CORPUS_SHA256
    sums = dict(reversed(line.split()) for line in (ROOT / "data" / "SHA256SUMS").read_text().splitlines())
    assert sums[gpt.CORPUS] == gpt.CORPUS_SHA256
    assert len(raw) <= 5 * 2**20 and gpt.CORPUS in (ROOT / "data" / "README.md").read_text()


def test_a_changed_corpus_is_refused(tmp_path):
    bad = tmp_path / "t.txt"
    bad.write_bytes((ROOT / "data" / gpt.CORPUS).read_bytes()[:-1])
    with pytest.raises(ValueError, match="SHA-256"):
        gpt.load_corpus(bad)


def test_tokens_round_trip_and_unigram_entropy(tokens):
    tok, text = tokens
    assert len(tok.chars) == 65 and tok.decode(tok.encode(text[:500])) == text[:500]
    assert gpt.unigram_entropy(torch.tensor([0, 1, 0, 1])) == pytest.approx(torch.log(torch.tensor(2.0)).item())
    assert gpt.unigram_entropy(torch.tensor([3, 3, 3])) == pytest.approx(0.0)


def test_split_is_contiguous_and_disjoint():
    ids = torch.arange(1000)
    train, val = gpt.split(ids, 0.1)
    assert len(train) == 900 and len(val) == 100
    assert torch.equal(torch.cat([train, val]), ids), "train then validation, in order, nothing shared"
    x, y = gpt.windows(val, 16, 20, torch.Generator().manual_seed(0))
    assert x.min() >= 900 and torch.equal(x[:, 1:], y[:, :-1]), "windows stay inside their split; y is x shifted"


def test_shapes_and_weight_tying():
    model = gpt.GPT(SMALL)
    logits = model(torch.randint(0, 65, (3, 32)))
    assert logits.shape == (3, 32, 65)
    assert model.head.weight is model.tok.weight
    p = gpt.parameters(model)
    untied = sum(t.numel() for t in model.state_dict().values())  # the state dict lists the tied matrix twice
    assert p["total"] == untied - 65 * 32 and p["embedding"] == 65 * 32 + 32 * 32
    assert gpt.ForCrossEntropy(model)(torch.zeros(2, 8, dtype=torch.long)).shape == (2, 65, 8)


@pytest.mark.parametrize("attend", [gpt.sdpa_attention, gpt.manual_attention])
def test_attention_is_causal(attend):
    torch.manual_seed(0)
    model = gpt.GPT(SMALL).eval()
    for block in model.blocks:
        block.attn.attend = attend
    x = torch.randint(0, 65, (2, 32))
    changed = x.clone()
    changed[:, 20] = (x[:, 20] + 1) % 65
    a, b = model(x), model(changed)
    assert torch.allclose(a[:, :20], b[:, :20], atol=1e-6), "a later token changed an earlier position's logits"
    assert not torch.allclose(a[:, 20:], b[:, 20:], atol=1e-4), "the changed token must change what follows"


def test_manual_attention_matches_sdpa():
    q, k, v = (torch.randn(2, 4, 16, 8) for _ in range(3))
    torch.testing.assert_close(gpt.manual_attention(q, k, v), gpt.sdpa_attention(q, k, v), atol=1e-5, rtol=1e-5)


def test_formula_flops_match_a_counted_step_within_5_percent():
    cfg = gpt.GPTConfig(vocab=65, seq_len=64, d_model=64, n_layers=2, n_heads=4)
    model = gpt.GPT(cfg)
    x = torch.randint(0, 65, (4, 64))
    counted = count_step(gpt.ForCrossEntropy(model), (x, torch.roll(x, -1, 1)),
                         optimizer=torch.optim.AdamW).flops / x.numel()
    formula = gpt.flops_per_token(cfg, gpt.parameters(model)["non_embedding"])
    assert formula["total"] == pytest.approx(counted, rel=0.05)
    # the counter also counts the attention backward's recomputed scores: 2 L T d more than the formula's 12 L T d
    matmul_weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert counted == pytest.approx(6 * matmul_weights + 14 * cfg.n_layers * cfg.seq_len * cfg.d_model, rel=1e-9)


def test_memory_prediction_parts_and_checkpointing():
    p = gpt.memory_prediction(SMALL, 8, 1000)
    assert p["params"] == p["grads"] == 4000 and p["adamw_states"] == 8000
    assert p["activations_per_block"] == (17 * 32 + 4) * 8 * 32 * 4
    ckpt = gpt.memory_prediction(gpt.GPTConfig(**{**SMALL.__dict__, "checkpoint": True}), 8, 1000)
    assert ckpt["activations_per_block"] == 32 * 8 * 32 * 4 < p["activations_per_block"]
    two = gpt.memory_prediction(SMALL, 4, 1000, accumulate=2)  # the first micro-batch's gradients stay alive
    assert two["peak"] == gpt.memory_prediction(SMALL, 4, 1000)["peak"] + two["grads"]


def test_checkpointed_model_gives_the_same_gradients():
    torch.manual_seed(0)
    plain = gpt.GPT(SMALL)
    ckpt = gpt.GPT(gpt.GPTConfig(**{**SMALL.__dict__, "checkpoint": True}))
    ckpt.load_state_dict(plain.state_dict())
    x = torch.randint(0, 65, (2, 32))
    for m in (plain, ckpt):
        gpt.lm_loss(m(x), torch.roll(x, -1, 1)).backward()
    for a, b in zip(plain.parameters(), ckpt.parameters()):
        torch.testing.assert_close(a.grad, b.grad)


def test_a_short_training_run_learns_and_generates(tokens):
    tok, text = tokens
    train, val = gpt.split(tok.encode(text[:200_000]))
    torch.manual_seed(0)
    model = gpt.GPT(SMALL)
    before = gpt.evaluate(model, val)
    run = gpt.train(model, train, val, steps=60, batch_size=16, eval_every=60)
    assert run["history"][-1]["val_loss"] < before - 0.5 and run["tokens"] == 60 * 16 * 32
    out = gpt.generate(model, tok.encode("ROMEO:"), 20)
    assert len(out) == 26 and tok.decode(out).startswith("ROMEO:")


def test_time_limit_stops_training():
    ids = torch.randint(0, 65, (5000,))
    run = gpt.train(gpt.GPT(SMALL), ids[:4000], ids[4000:], steps=10_000, batch_size=4, time_limit_s=0.5)
    assert run["steps"] < 10_000 and run["train_s"] >= 0.5


def test_token_windows_do_not_overlap_and_targets_are_shifted_by_one():
    tokens = torch.arange(23)
    w = gpt.TokenWindows(tokens, 5)
    assert len(w) == 4  # 22 // 5: each window needs its next token too
    starts = [int(w[i][0][0]) for i in range(len(w))]
    assert starts == [0, 5, 10, 15]
    for i in range(len(w)):
        x, y = w[i]
        assert torch.equal(y, x + 1)
    with pytest.raises(IndexError):
        w[len(w)]
    with pytest.raises(ValueError, match="use a shorter seq_len"):
        gpt.TokenWindows(torch.arange(5), 5)


@pytest.mark.parametrize("capability,dtype", [((7, 5), torch.float16), ((8, 0), torch.bfloat16), ((9, 0), torch.bfloat16)])
def test_attention_is_timed_in_the_gpus_native_half_precision(monkeypatch, capability, dtype):
    """Flash and cuDNN attention take no fp32: on a T4 (7.5) fp16, from Ampere (8.0) bf16; fp32 on a CPU."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert gpt.attention_dtype("cuda") is dtype
    assert gpt.attention_dtype("cpu") is torch.float32


def test_the_memory_snapshot_records_python_stacks_only(monkeypatch, tmp_path):
    """CPU stand-in for CUDA's allocator history: C++ stacks ("all", the default) have taken minutes to symbolise."""
    import pickle

    seen = []
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", lambda *a, **kw: seen.append(kw))
    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", lambda p: open(p, "wb").write(pickle.dumps({"ok": 1})))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    got = gpt.memory_snapshot(SMALL, 2, "cpu", tmp_path / "snap.pickle", steps=1)
    assert got == {"ok": 1}
    assert seen[0].get("stacks") == "python" and seen[-1] == {"enabled": None}


def _size_table(notebook: str, column: str) -> dict:
    """The ``column`` ("gpu", "cpu", "quick") of a notebook's ``lesson.sizes(...)`` table, from its source."""
    import ast
    import json
    from pathlib import Path

    cells = json.loads((Path(__file__).resolve().parents[1] / "notebooks" / notebook).read_text())["cells"]
    for cell in cells:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and "lesson.sizes(" in source:
            call = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call)
                        and getattr(n.func, "attr", "") == "sizes")
            table = next(k.value for k in call.keywords if k.arg == column)
            return {k.arg: ast.literal_eval(k.value) for k in table.keywords
                    if isinstance(k.value, (ast.Constant, ast.List, ast.Tuple, ast.Dict))}
    raise AssertionError(f"{notebook} has no size table")


@pytest.mark.parametrize("notebook,names", [
    ("11_small_gpt.ipynb", ("d_model", "n_layers", "n_heads", "seq_len", "batch")),
    ("10_diagnose_your_training.ipynb", ("gpt_d", "gpt_layers", None, "gpt_seq", "gpt_batch")),  # 4 heads
])
def test_the_gpu_sized_gpt_step_fits_a_t4(notebook, names):
    """The largest training step of the GPU size tables, predicted with lesson 11's own formula in fp32: weights,
    AdamW state and activations within a T4's 15 GB with a quarter to spare (the CUDA context, the allocator's
    rounding, attention's workspace are not in the formula)."""
    size = _size_table(notebook, "gpu")
    d, layers, heads, seq, batch = (size[n] if n else 4 for n in names)
    cfg = gpt.GPTConfig(vocab=65, seq_len=seq, d_model=d, n_layers=layers, n_heads=heads)
    n_params = sum(p.numel() for p in gpt.GPT(cfg).parameters())
    peak = gpt.memory_prediction(cfg, batch, n_params)["peak"]
    assert peak <= 0.75 * 15e9, f"{notebook}: predicted peak {peak / 1e9:.1f} GB on a T4"
