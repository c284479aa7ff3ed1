"""Pinned host->GPU bandwidth: helpers.transfer.copy_bandwidth against a plain copy timed with CUDA events.

The helper must not under-report: the last line prints helper / CUDA-events (goal >= 0.95). On a machine
without CUDA it says so and exits 0.
"""
import statistics
import sys

import torch

from helpers import transfer

SIZE = 256 * transfer.MIB


def main() -> int:
    if not torch.cuda.is_available():
        print("skipped: no CUDA device on this machine (this benchmark measures host->GPU copies)")
        return 0
    helper, events = [], []
    for _ in range(5):  # interleaved
        helper.append(transfer.copy_bandwidth(SIZE, "cpu", "cuda", pinned=True, non_blocking=True)["gbps"])
        events.append(transfer.cuda_event_copy_gbps(SIZE))
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, {transfer.format_bytes(SIZE)} pinned H2D, "
          "5 interleaved repetitions")
    print(f"helpers.transfer.copy_bandwidth: median {statistics.median(helper):.2f} GB/s")
    print(f"plain copy timed by CUDA events: median {statistics.median(events):.2f} GB/s")
    print(f"helper / CUDA events: {statistics.median(helper) / statistics.median(events):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
