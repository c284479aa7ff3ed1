"""Unit tests of helpers.transfer: bandwidth arithmetic, sizes, and the copy/overlap code on the CPU."""
import pytest
import torch

from helpers import transfer


def test_bandwidth_math():
    assert transfer.gbps(2 * 10**9, 0.5) == pytest.approx(4.0)
    with pytest.raises(ValueError):
        transfer.gbps(1, 0)


def test_sizes_and_formatting():
    assert transfer.transfer_sizes(4 * transfer.KIB, 64 * transfer.KIB) == [4096, 16384, 65536]
    assert transfer.transfer_sizes(transfer.KIB, transfer.GIB, factor=1024) == [1024, 2**20, 2**30]
    assert [transfer.format_bytes(n) for n in (512, 4096, 3 * 2**20, 2**30)] == ["512 B", "4 KiB", "3 MiB", "1 GiB"]


@pytest.mark.parametrize("gen,width,expected", [(3, 16, 15.75), (4, 16, 31.5), (5, 16, 63.0), (1, 1, 0.25)])
def test_pcie_theoretical(gen, width, expected):
    assert transfer.pcie_theoretical(gen, width)["gbps"] == pytest.approx(expected, rel=0.01)


def test_unknown_pcie_generation():
    with pytest.raises(ValueError, match="generation 9"):
        transfer.pcie_theoretical(9, 16)


def test_host_copy_bandwidth_record():
    rec = transfer.copy_bandwidth(1 << 20, "cpu", "cpu", min_run_time=0.05)
    assert rec["bytes"] == 1 << 20 and rec["src"] == rec["dst"] == "cpu"
    assert rec["gbps"] == pytest.approx(transfer.gbps(rec["bytes"], rec["seconds"]))
    assert 0.05 < rec["gbps"] < 1000  # a real memory copy, not a no-op


def test_pinned_memory_without_cuda_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="pinned .* needs a CUDA device"):
        transfer.host_buffer(16, pinned=True)
    with pytest.raises(ValueError, match="CUDA events need"):
        transfer.cuda_event_copy_gbps(16)
    assert transfer.pcie_link() is None or isinstance(transfer.pcie_link(), dict)


@pytest.mark.parametrize("overlap", [False, True])
def test_overlapped_steps_computes_every_batch_in_order(overlap):
    batches = [torch.full((4,), float(i)) for i in range(5)]
    seen = []
    seconds = transfer.overlapped_steps(batches, lambda b: seen.append(b[0].item()), "cpu", overlap=overlap)
    assert seen == [0.0, 1.0, 2.0, 3.0, 4.0] and seconds > 0


def test_pin_each_time_needs_cuda_and_a_host_source(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="pin_each_time pins a host source, which needs CUDA"):
        transfer.copy_bandwidth(1024, "cpu", "cpu", pin_each_time=True)


def test_beyond_caches_takes_only_large_sizes():
    bw = {2**20: 40.0, 2**28: 12.0, 2**29: 11.0, 2**30: 10.0}
    assert transfer.beyond_caches(bw) == 11.0
    assert transfer.beyond_caches({2**20: 40.0}) is None


def test_batches_go_to_a_gpu_non_blocking(monkeypatch):
    """fit moves every batch with non_blocking=True on CUDA, pinned or not (a recorder stands in for the GPU copy)."""
    from helpers import step

    calls = []
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *a, **k: calls.append(k.get("non_blocking")) or self)
    step.split_batch((torch.zeros(2, 3), torch.zeros(2, dtype=torch.long)), torch.device("cuda"))
    assert calls == [True, True]
    calls.clear()
    step.split_batch((torch.zeros(2, 3), torch.zeros(2, dtype=torch.long)), torch.device("cpu"))
    assert calls == [False, False]
