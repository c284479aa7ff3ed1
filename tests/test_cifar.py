"""CIFAR-10 loading: the real image-folder tree from ../shared/data (extracted by conftest), synthetic stand-in."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers.cifar10 import (CIFAR10_CLASSES, CIFAR10_MEAN, CIFAR10_STD, ImageTensorDataset, cifar10_transform,
                             load_cifar10, synthetic_images)
from helpers.models import CompactNet, ConvBlockNet, whitening_filters

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cifar_dir():
    path = os.environ.get("COURSE_CIFAR10_DIR")
    if not path:
        if os.environ.get("CI"):
            pytest.fail("CI must have ../shared/data/cifar10-jpg.tar.gz; conftest.py extracts it")
        pytest.skip("no CIFAR-10 tarball on this machine (../shared/data/cifar10-jpg.tar.gz)")
    return path


def test_image_folder_tree_reads_real_cifar10(cifar_dir):
    data = load_cifar10("test", cifar_dir, per_class=20)
    assert data.classes == CIFAR10_CLASSES
    assert data.images.shape == (200, 3, 32, 32) and data.images.dtype == torch.uint8
    assert torch.bincount(data.labels).tolist() == [20] * 10
    assert 60 < data.images.float().mean() < 180  # real photos, not blank
    assert "image folder" in data.source


def test_parent_of_the_tree_is_accepted(cifar_dir):
    parent = os.path.dirname(cifar_dir)
    assert load_cifar10("train", parent, per_class=2).images.shape == (20, 3, 32, 32)


def test_missing_or_wrong_folders_give_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_cifar10("train", tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="COURSE_CIFAR10_DIR"):
        load_cifar10("train", tmp_path)  # exists, but holds nothing usable
    (tmp_path / "t" / "train" / "a").mkdir(parents=True)
    (tmp_path / "t" / "test").mkdir()
    with pytest.raises(FileNotFoundError, match="no class folders"):
        load_cifar10("test", tmp_path / "t")
    with pytest.raises(ValueError, match="'train' or 'test'"):
        load_cifar10("val", tmp_path)


def test_transforms_and_dataset():
    data = synthetic_images(20)
    assert "NOT CIFAR-10" in data.source
    x, y = ImageTensorDataset(data, cifar10_transform(train=True))[3]
    assert x.shape == (3, 32, 32) and x.dtype == torch.float32 and y.item() == 3
    plain = ImageTensorDataset(data, cifar10_transform(train=False))
    assert torch.equal(plain[0][0], plain[0][0])  # deterministic without augmentation
    from torchvision.transforms import v2
    by_torchvision = v2.Compose([v2.ToDtype(torch.float32, scale=True), v2.Normalize(CIFAR10_MEAN, CIFAR10_STD)])
    torch.testing.assert_close(plain[5][0], by_torchvision(data.images[5]))
    other = synthetic_images(20, noise_seed=1)
    assert not torch.equal(other.images, data.images) and torch.equal(other.labels, data.labels)


def test_evaluation_transform_does_not_import_torchvision():
    code = ("import sys; from helpers.cifar10 import cifar10_transform, synthetic_images; "
            "cifar10_transform(train=False)(synthetic_images(2).images[0]); print('torchvision' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "False"


def test_conv_block_net_matches_the_matlab_layout():
    net = ConvBlockNet()
    convs = [m for m in net.modules() if isinstance(m, torch.nn.Conv2d)]
    assert len(convs) == 12 and [c.out_channels for c in convs[::4]] == [32, 64, 128]
    assert sum(isinstance(m, torch.nn.BatchNorm2d) for m in net.modules()) == 12
    assert sum(isinstance(m, torch.nn.MaxPool2d) for m in net.modules()) == 2
    assert net(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    small = ConvBlockNet((8, 16), depth=1, batch_norm=False)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in small.modules())
    assert small(torch.randn(1, 3, 32, 32)).shape == (1, 10)


def test_whitening_filters_decorrelate_the_patches_they_were_fit_on():
    g = torch.Generator().manual_seed(0)
    base = torch.randn(64, 1, 16, 16, generator=g)
    images = torch.cat([base, 0.5 * base + 0.1 * torch.randn(64, 1, 16, 16, generator=g),
                        torch.randn(64, 1, 16, 16, generator=g)], dim=1)  # channels 0 and 1 strongly correlated
    w = whitening_filters(images, eps=0.0)
    assert w.shape == (24, 3, 2, 2) and torch.equal(w[12:], -w[:12])
    out = torch.nn.functional.conv2d(images, w[:12]).permute(0, 2, 3, 1).reshape(-1, 12)
    assert torch.allclose(torch.cov(out.T), torch.eye(12), atol=1e-3)  # uncorrelated, unit variance


def test_compact_net_freezes_its_whitening_layer_and_costs_a_fifth_of_the_flops():
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    net = CompactNet().init_whitening(torch.randn(100, 3, 32, 32))
    assert not net.whiten.weight.requires_grad and net.whiten.bias.requires_grad
    x = torch.randn(4, 3, 32, 32)
    net(x).sum().backward()
    assert net.whiten.weight.grad is None and net.head.weight.grad is not None
    flops = []
    for model in (net, ConvBlockNet()):
        with FlopCounterMode(display=False) as counter:
            model(x[:1])
        flops.append(counter.get_total_flops())
    assert 4 < flops[1] / flops[0] < 6, flops
    assert CompactNet((8, 16, 16), n_classes=3)(x).shape == (4, 3)


def test_flip_accuracy_classifies_by_the_summed_logits_of_image_and_mirror():
    from helpers.training import flip_accuracy

    # A linear "model" that reads only the first column: the mirror image shows it the last column instead.
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 2, bias=False))
    with torch.no_grad():
        net[1].weight.copy_(torch.tensor([[1.0, 0, 0, 0], [-1.0, 0, 0, 0]]))
    x = torch.tensor([[2.0, 0, 0, -3.0],    # alone: class 0 (2 > -2); summed with the mirror: 2-3 < 0, class 1
                      [1.0, 0, 0, 5.0],     # class 0 either way
                      [-1.0, 0, 0, -1.0]]).view(3, 1, 1, 4)  # class 1 either way
    target = torch.tensor([1, 0, 1])
    found = flip_accuracy(net, [(x[:2], target[:2]), (x[2:], target[2:])], "cpu")
    assert found == {"accuracy": 1.0, "plain": pytest.approx(2 / 3), "count": 3}


def test_stand_in_only_in_quick_mode(tmp_path, monkeypatch):
    from helpers.cifar10 import cifar10_or_standin

    monkeypatch.delenv("COURSE_CIFAR10_DIR", raising=False)
    train, test, note = cifar10_or_standin(True, tmp_path, per_class=(3, 2))
    assert len(train) == 30 and len(test) == 20 and "NOT CIFAR-10" in note and "NOT CIFAR-10" in train.source
    with pytest.raises(FileNotFoundError):
        cifar10_or_standin(False, tmp_path)


def test_real_data_has_no_stand_in_note(cifar_dir):
    from helpers.cifar10 import cifar10_or_standin

    train, test, note = cifar10_or_standin(True, cifar_dir, per_class=(2, 1))
    assert note is None and len(train) == 20 and len(test) == 10


def test_batch_augment_crops_within_padding_and_flips():
    from helpers.cifar10 import CIFAR10_MEAN, CIFAR10_STD, batch_augment

    img = torch.arange(3 * 8 * 8, dtype=torch.float32).reshape(1, 3, 8, 8).remainder(251).to(torch.uint8)
    batch = img.repeat(64, 1, 1, 1)
    out = batch_augment(batch, padding=2, generator=torch.Generator().manual_seed(0))
    assert out.shape == (64, 3, 8, 8) and out.dtype == torch.float32
    mean, std = torch.tensor(CIFAR10_MEAN).view(1, 3, 1, 1), torch.tensor(CIFAR10_STD).view(1, 3, 1, 1)
    raw = torch.round((out * std + mean) * 255)
    padded = torch.nn.functional.pad(img.float(), (2, 2, 2, 2))[0]
    found_flip = found_shift = False
    for k in range(64):
        matches = [(dy, dx, f) for dy in range(5) for dx in range(5) for f in (False, True)
                   if torch.equal(raw[k], (padded[:, dy:dy + 8, dx:dx + 8].flip(2) if f else
                                           padded[:, dy:dy + 8, dx:dx + 8]))]
        assert matches, f"image {k} is not a shifted (and possibly flipped) crop"
        found_flip |= any(f for _, _, f in matches)
        found_shift |= any((dy, dx) != (2, 2) for dy, dx, _ in matches)
    assert found_flip and found_shift


def _one_image_set(n=64):
    from helpers.cifar10 import ImageSet

    img = torch.arange(3 * 8 * 8).reshape(1, 3, 8, 8).remainder(251).to(torch.uint8)
    return ImageSet(img.repeat(n, 1, 1, 1), torch.arange(n) % 10, [str(k) for k in range(10)], "test")


def test_device_loader_ranks_split_the_epoch_and_draw_different_augmentation():
    from helpers.cifar10 import DeviceLoader

    data = _one_image_set(64)  # every image identical: any difference between ranks is augmentation
    loaders = [DeviceLoader(data, 16, rank=r, world=2, seed=3) for r in range(2)]
    labels = [torch.cat([y for _, y in dl]) for dl in loaders]
    assert [len(dl) for dl in loaders] == [2, 2] and all(len(y) == 32 for y in labels)
    x0, x1 = (next(iter(dl))[0] for dl in loaders)
    assert not torch.equal(x0, x1), "ranks must not draw the same crops and flips"
    idx = [dl._indices() for dl in loaders]
    assert sorted(torch.cat(idx).tolist()) == list(range(64)), "together the ranks see every image once"


def test_device_loader_replays_an_epoch_and_changes_with_the_next():
    from helpers.cifar10 import DeviceLoader

    dl = DeviceLoader(_one_image_set(40), 16, seed=0, channels_last=True)
    first = [x for x, _ in dl]
    again = [x for x, _ in dl]
    assert len(first) == 3 and all(torch.equal(a, b) for a, b in zip(first, again)), "resume replays an epoch"
    assert first[0].is_contiguous(memory_format=torch.channels_last) and first[0].dtype == torch.float32
    dl.set_epoch(1)
    assert not torch.equal(next(iter(dl))[0], first[0])
    plain = DeviceLoader(_one_image_set(40), 16, augment=False, shuffle=False)
    x, y = next(iter(plain))
    assert y.tolist() == list(range(10)) + list(range(6)) and torch.allclose(x[0], x[1])


def test_device_loader_trains_with_fit():
    from helpers.cifar10 import DeviceLoader, synthetic_images
    from helpers.models import ConvBlockNet
    from helpers.training import fit, seed_everything

    seed_everything(0)
    data = synthetic_images(400)
    model = ConvBlockNet((8, 16, 16), 1)
    hist = fit(model, DeviceLoader(data, 50, augment=False), epochs=4, device="cpu", progress=False,
               optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    assert hist.epochs[-1]["train_accuracy"] > 0.5, hist.epochs[-1]


def test_fit_gives_a_device_loader_a_new_epoch_each_time(monkeypatch):
    from helpers.cifar10 import DeviceLoader, synthetic_images
    from helpers.training import fit

    seen = []
    dl = DeviceLoader(synthetic_images(40), 20)
    real = dl.set_epoch
    monkeypatch.setattr(dl, "set_epoch", lambda e: seen.append(e) or real(e))
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 10))
    fit(model, dl, epochs=3, optimizer=torch.optim.SGD(model.parameters(), lr=0.01), device="cpu", progress=False)
    assert seen == [0, 1, 2], "without set_epoch every epoch would repeat the same order and augmentation"


@pytest.fixture
def silent_server():
    """A local address that accepts connections and never answers: a download that hangs."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held, stop = [], threading.Event()

    def hold():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}/cifar-10-python.tar.gz"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


@pytest.mark.parametrize("on_kaggle", [False, True])
def test_a_download_that_hangs_is_given_up_in_one_line_and_leaves_nothing(silent_server, tmp_path, monkeypatch,
                                                                            on_kaggle):
    import torchvision

    from helpers import cifar10

    monkeypatch.delenv("COURSE_CIFAR10_DIR", raising=False)
    monkeypatch.setattr(cifar10, "_download_dir", lambda: tmp_path / "cifar10")
    monkeypatch.setattr(cifar10, "DOWNLOAD_TIMEOUT_S", 0.5)  # (the course waits 30 s)
    monkeypatch.setattr(torchvision.datasets.CIFAR10, "url", silent_server)
    if on_kaggle:
        monkeypatch.setenv(cifar10.KAGGLE_ENV, "Interactive")
    else:
        monkeypatch.delenv(cifar10.KAGGLE_ENV, raising=False)
    with pytest.raises(FileNotFoundError) as err:
        load_cifar10("train")
    message = str(err.value)
    assert "\n" not in message and "could not be downloaded" in message and "COURSE_CIFAR10_DIR" in message
    assert "timed out" in message.lower() or "timeout" in message.lower(), message
    assert ("/kaggle/input" in message) is on_kaggle
    assert not (tmp_path / "cifar10").exists(), "nothing half-written"
