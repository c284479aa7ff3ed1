"""helpers.diagnose on the workloads nobody tuned it for (tests/workloads/) and on lesson 11's GPT (examples/),
idle and with one core kept busy by a plain busy loop: the verdict, the recommended levers with their 10th-90th
percentile intervals, and how long each diagnosis took. Prints one Markdown table (issue 22's figures).

    python benchmarks/diagnose_workloads.py [--budget-s 10] [--busy]
"""
import argparse
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

from helpers.diagnose import diagnose, load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = {"ResNet-18 (torchvision)": "tests/workloads/resnet.py", "tiny MLP, batch 8": "tests/workloads/tiny_mlp.py",
           "elementwise chain": "tests/workloads/elementwise.py", "transformer LM": "tests/workloads/transformer.py",
           "JPEG ImageFolder, 0 workers": "tests/workloads/jpeg_folder.py",
           "lesson 11 GPT": "examples/small_gpt.py"}


def row(name: str, script: str, budget_s: float) -> str:
    model, loader, loss_fn, opt, host = load_script(str(ROOT / script))
    t0 = time.perf_counter()
    d = diagnose(model, loader, loss_fn, opt, "cpu", budget_s, host_inputs=host)
    took = time.perf_counter() - t0
    rec = "; ".join(f"{r['lever']} {r['step_speedup']:.2f}× ({r['step_low']:.2f}–{r['step_high']:.2f})"
                    for r in d.recommendations) or "nothing"
    mfu = d.floors.get("mfu_real")
    return (f"| {name} | {d.bottleneck} | {rec} | {'' if mfu is None else f'{mfu:.1%}'} | "
            f"±{100 * d.noise.get('real step', 0):.0f} % | {took:.0f} s |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget-s", type=float, default=10)
    ap.add_argument("--busy", action="store_true", help="keep one core busy with a busy loop meanwhile")
    args = ap.parse_args()
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.busy else None
    try:
        print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
              f"{torch.get_num_threads()} threads, budget {args.budget_s:.0f} s, "
              f"{'one core busy' if busy else 'idle'}\n")
        print("| workload | verdict | recommended (whole step, 10th–90th %) | MFU | step noise | took |")
        print("|---|---|---|---|---|---|")
        for name, script in SCRIPTS.items():
            print(row(name, script, args.budget_s), flush=True)
    finally:
        if busy:
            busy.kill()
            busy.wait()


if __name__ == "__main__":
    main()
