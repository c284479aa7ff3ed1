"""Unit tests of helpers.vowels (Japanese Vowels, padding, bucketing) and helpers.models."""
from collections import Counter

import pytest
import torch
from torch.utils.data import DataLoader

from helpers.vowels import (BucketBatchSampler, SequenceDataset, load_japanese_vowels, pad_collate,
                          padding_fraction)
from helpers.models import SequenceClassifier


@pytest.fixture(scope="module")
def vowels():
    return load_japanese_vowels("train"), load_japanese_vowels("test")


def test_japanese_vowels_counts_balance_lengths_features(vowels):
    (xs, ys), (xt, yt) = vowels
    assert len(xs) == len(ys) == 270 and len(xt) == len(yt) == 370
    assert Counter(ys) == {str(k): 30 for k in range(1, 10)}
    assert set(yt) == {str(k) for k in range(1, 10)}
    lengths = [x.shape[0] for x in xs + xt]
    assert min(lengths) == 7 and max(lengths) == 29
    assert {x.shape[1] for x in xs + xt} == {12}
    assert all(x.dtype == torch.float32 and torch.isfinite(x).all() for x in xs)
    # the first training case starts with the values printed in the .ts file
    assert xs[0][0, 0].item() == pytest.approx(1.860936) and xs[0][0, 1].item() == pytest.approx(-0.207383)


def test_loader_errors(tmp_path):
    with pytest.raises(ValueError, match="'train' or 'test'"):
        load_japanese_vowels("validation")
    with pytest.raises(FileNotFoundError, match="git checkout"):
        load_japanese_vowels("train", root=tmp_path)
    (tmp_path / "JapaneseVowels_TRAIN.ts").write_text("@data\n1,2:3,x:1\n")
    with pytest.raises(ValueError, match=":2: not a number"):
        load_japanese_vowels("train", root=tmp_path)
    (tmp_path / "JapaneseVowels_TRAIN.ts").write_text("@data\n1,2:3:1\n")
    with pytest.raises(ValueError, match="different lengths"):
        load_japanese_vowels("train", root=tmp_path)


def test_pad_collate_shapes_and_cpu_lengths():
    ds = SequenceDataset([torch.ones(3, 2), torch.ones(5, 2), torch.ones(1, 2)], torch.tensor([0, 1, 2]))
    x, lengths, y = pad_collate([ds[i] for i in range(3)])
    assert x.shape == (3, 5, 2) and lengths.tolist() == [3, 5, 1] and y.tolist() == [0, 1, 2]
    assert lengths.dtype == torch.int64 and lengths.device.type == "cpu"
    assert x[0, 3:].abs().sum() == 0 and x[2, 1:].abs().sum() == 0  # zero padding


def test_dataset_length_mismatch():
    with pytest.raises(ValueError, match="2 sequences but 1 targets"):
        SequenceDataset([torch.ones(1, 1)] * 2, torch.tensor([0]))


def test_bucketing_covers_every_index_once_and_cuts_padding(vowels):
    (xs, _), _ = vowels
    lengths = [x.shape[0] for x in xs]
    sampler = BucketBatchSampler(lengths, 27, seed=3)
    batches = list(sampler)
    assert len(batches) == len(sampler) == 10
    assert sorted(i for b in batches for i in b) == list(range(270))
    shuffled = torch.randperm(270, generator=torch.Generator().manual_seed(0)).tolist()
    plain = [shuffled[i:i + 27] for i in range(0, 270, 27)]
    assert padding_fraction(lengths, batches) < 0.5 * padding_fraction(lengths, plain)


def test_bucketing_is_reproducible_per_epoch():
    sampler = BucketBatchSampler(list(range(40)), 4, seed=0)
    first = list(sampler)
    assert list(sampler) == first
    sampler.set_epoch(1)
    assert list(sampler) != first
    sampler.set_epoch(0)
    assert list(sampler) == first
    assert list(BucketBatchSampler([3, 1, 2], 2, shuffle=False)) == [[1, 2], [0]]


def test_padding_fraction_exact():
    assert padding_fraction([2, 4], [[0, 1]]) == pytest.approx(0.25)
    assert padding_fraction([2, 4], [[0], [1]]) == 0.0


def test_classifier_reads_each_sequence_true_last_step():
    """Padding after a sequence must not change its output (packing stops at the true length)."""
    torch.manual_seed(0)
    for bidirectional in (False, True):
        model = SequenceClassifier(3, 4, hidden=8, bidirectional=bidirectional).eval()
        seq = torch.randn(5, 3)
        alone = model(seq[None], torch.tensor([5]))
        padded = torch.cat([seq, torch.randn(4, 3)])[None]  # garbage after step 5
        assert torch.allclose(model(padded, torch.tensor([5])), alone, atol=1e-6)
        batch, lengths, _ = pad_collate([(seq, 0), (torch.randn(9, 3), 1)])
        assert torch.allclose(model(batch, lengths)[0], alone[0], atol=1e-6)


def test_classifier_rejects_lengths_off_the_cpu():
    model = SequenceClassifier(2, 3, hidden=4)
    with pytest.raises(ValueError, match=r"lengths are on meta.*host_inputs=\(1,\)"):
        model(torch.randn(2, 3, 2), torch.tensor([3, 2], device="meta"))


def test_classifier_learns_japanese_vowels_quickly(vowels):
    from helpers.labels import LabelEncoder
    from helpers.training import evaluate, fit, seed_everything

    (xs, ys), (xt, yt) = vowels
    enc = LabelEncoder.fit(ys)
    seed_everything(0)
    train = DataLoader(SequenceDataset(xs, enc.encode(ys)), batch_sampler=BucketBatchSampler([len(x) for x in xs], 27),
                       collate_fn=pad_collate)
    model = SequenceClassifier(12, 9, hidden=32, bidirectional=True)
    fit(model, train, epochs=6, optimizer=torch.optim.Adam(model.parameters(), lr=0.01), host_inputs=(1,),
        grad_clip=1.0, progress=False)
    acc = evaluate(model, DataLoader(SequenceDataset(xt, enc.encode(yt)), batch_size=128, collate_fn=pad_collate),
                   host_inputs=(1,))["accuracy"]
    assert acc > 0.6, f"6 epochs should already be far above chance (1/9); got {acc:.3f}"


def test_lstm_stays_off_mps():
    from helpers.models import lstm_device

    assert lstm_device("mps") == torch.device("cpu")
    assert lstm_device("cuda:1") == torch.device("cuda", 1) and lstm_device("cpu") == torch.device("cpu")
