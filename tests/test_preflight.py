"""`make check` (tools/preflight.py): the pre-flight check reports a planted problem with its fix, in time."""
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_preflight_reports_a_corrupted_data_file_with_its_fix(tmp_path):
    data = tmp_path / "data"
    shutil.copytree(ROOT / "data", data, ignore=shutil.ignore_patterns("cifar10", "reference"))
    with open(data / "JapaneseVowels_TRAIN.ts", "ab") as f:
        f.write(b"1.0 ")  # one planted change: the checksum no longer matches
    report = tmp_path / "preflight.md"
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "preflight.py"), "--data-dir", str(data),
                           "--no-network", "--out", str(report)], capture_output=True, text=True, timeout=180)
    assert done.returncode == 1, done.stdout + done.stderr
    line = next(l for l in done.stdout.splitlines() if l.startswith("BLOCKS:"))
    assert "JapaneseVowels_TRAIN.ts" in line and "TEST" not in line and "fix: restore the shipped files" in line
    text = report.read_text()
    assert "| torchrun all-reduce | gloo, 2 processes: ok" in text  # the real check ran, on this CPU machine
    assert "JapaneseVowels_TRAIN.ts" in text and "NOT READY" in done.stdout


def test_preflight_passes_on_the_shipped_data(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "preflight.py"), "--no-network",
                           "--out", str(tmp_path / "p.md")], capture_output=True, text=True, timeout=180)
    assert "Japanese Vowels              checksums ok" in done.stdout
    assert "BLOCKS" not in done.stdout and done.returncode == 0, done.stdout + done.stderr
