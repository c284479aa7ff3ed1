"""Unit tests of helpers.labels: categorical labels <-> int64 indices."""
import pandas as pd
import pytest
import torch

from helpers.labels import LabelEncoder, UnseenLabelError
from helpers.training import load_checkpoint, save_checkpoint


def test_round_trip_and_natural_order():
    labels = ["10", "2", "1", "2", "10"]
    enc = LabelEncoder.fit(labels)
    assert enc.classes == ["1", "2", "10"]
    idx = enc.encode(labels)
    assert idx.dtype == torch.int64 and idx.tolist() == [2, 1, 0, 1, 2]
    assert enc.decode(idx) == labels
    assert len(enc) == 3


def test_python_objects_as_classes():
    enc = LabelEncoder.fit([3, 1, 2, 3])
    assert enc.classes == [1, 2, 3]
    assert enc.decode(enc.encode([2, 3])) == [2, 3]


def test_pandas_categorical_keeps_its_category_order():
    cat = pd.Categorical(["low", "high", "mid", "low"], categories=["low", "mid", "high"], ordered=True)
    enc = LabelEncoder.fit(cat)
    assert enc.classes == ["low", "mid", "high"]
    assert enc.encode(cat).tolist() == [0, 2, 1, 0]
    series = pd.Series(cat)
    assert LabelEncoder.fit(series).classes == ["low", "mid", "high"]
    assert enc.encode(series).tolist() == [0, 2, 1, 0]


def test_decode_scores_is_scores2label():
    enc = LabelEncoder(["a", "b", "c"])
    scores = torch.tensor([[0.1, 0.7, 0.2], [5.0, -1.0, 0.0], [0.0, 0.0, 9.0]])
    assert enc.decode(scores) == ["b", "a", "c"]


def test_encode_on_a_device_and_decode_from_it():
    enc = LabelEncoder(["x", "y"])
    t = enc.encode(["y", "x"], device="meta")  # any non-host device: the tensor is created there
    assert t.device.type == "meta" and t.dtype == torch.int64


def test_unseen_labels_are_named_with_the_known_classes():
    enc = LabelEncoder.fit(["1", "2", "3"])
    with pytest.raises(UnseenLabelError) as err:
        enc.encode(["1", "12", "7", "12"])
    msg = str(err.value)
    assert "'7', '12'" in msg and "['1', '2', '3']" in msg
    assert isinstance(err.value, ValueError)


@pytest.mark.parametrize("bad,match", [(torch.tensor([0, 3]), "outside 0..2"),
                                       (torch.tensor([0.5, 1.0]), "floating-point"),
                                       (torch.zeros(2, 3, 1), "shape")])
def test_decode_rejects_bad_input(bad, match):
    with pytest.raises(ValueError, match=match):
        LabelEncoder(["a", "b", "c"]).decode(bad)


def test_duplicate_or_empty_classes_are_rejected():
    with pytest.raises(ValueError, match="unique"):
        LabelEncoder(["a", "a"])
    with pytest.raises(ValueError, match="at least one"):
        LabelEncoder([])


def test_saved_with_a_checkpoint_as_plain_data(tmp_path):
    enc = LabelEncoder.fit(["b", "a", "c"])
    save_checkpoint(tmp_path / "m.pt", {"model": {"w": torch.ones(1)}, "labels": enc.state_dict()})
    state = load_checkpoint(tmp_path / "m.pt")  # weights_only=True inside
    assert LabelEncoder.from_state_dict(state["labels"]).classes == ["a", "b", "c"]


def test_non_plain_classes_cannot_be_saved():
    with pytest.raises(TypeError, match="plain data"):
        LabelEncoder([(1, 2), (3, 4)]).state_dict()
