"""Unit tests of helpers.timing: the clock must wait for queued (asynchronous) work."""
import threading
import time

import pytest

from helpers import timing


class FakeAsyncDevice:
    """Stands in for a GPU: ``launch`` returns at once, the work finishes 20 ms later; ``sync`` waits."""

    def __init__(self, work_s=0.02):
        self.work_s = work_s
        self.pending = []

    def launch(self):
        done = threading.Event()
        threading.Timer(self.work_s, done.set).start()
        self.pending.append(done)

    def sync(self):
        while self.pending:
            self.pending.pop().wait()


def test_synchronised_timer_sees_the_asynchronous_work():
    dev = FakeAsyncDevice()

    def clock():
        dev.sync()
        return time.perf_counter()

    t = timing.time_fn(dev.launch, label="fake kernel", clock=clock, warmup=1, min_run_time=0.1)
    assert t.median_s >= 0.018, t
    wrong = timing.time_unsynchronised(dev.launch, repeats=5)
    dev.sync()
    assert wrong < 0.005, "launching is quick; only a synchronised clock sees the 20 ms"


def test_cpu_timing_record():
    t = timing.time_fn(lambda: time.sleep(0.002), "cpu", label="sleep", min_run_time=0.05)
    assert t.device == "cpu" and t.label == "sleep"
    assert 0.0015 < t.median_s < 0.05
    assert t.min_s <= t.median_s <= t.max_s and t.iqr_s >= 0 and t.runs == len(t.times_s) >= 1
    assert set(t.state_dict()) >= {"median_s", "iqr_s", "runs", "times_s"}
    assert "sleep on cpu: median" in str(t)


@pytest.mark.parametrize("seconds,text", [(1.5, "1.5 s"), (0.00123, "1.23 ms"), (2.5e-6, "2.5 µs"), (3e-9, "3 ns")])
def test_format_seconds(seconds, text):
    assert timing.format_seconds(seconds) == text
