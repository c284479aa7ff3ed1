"""Copy results measured on real hardware into data/reference/<hardware-name>/ (after `make gpu-check`).

    python tools/promote_reference.py OUT/results [--force]

Only full-mode results measured on a GPU are promoted (quick-mode figures and CPU runs are not references), never
those of a notebook stopped at its time limit; results sized to a time budget (`make gpu-check`) keep their
`budget_s`, which the notebooks print beside the figures.
Each file keeps the hardware, driver and torch version it was measured with; commit the new folder with a message
naming the machine.
"""
import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from helpers.results import load_results, reference_dir


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", help="a folder of results JSON files (build/results or $OUT/results)")
    ap.add_argument("--force", action="store_true", help="replace existing reference files")
    args = ap.parse_args(argv)
    files = sorted(Path(args.results).glob("*.json"))
    if not files:
        print(f"error: no results files in {args.results}", file=sys.stderr)
        return 2
    for path in files:
        rec = load_results(path)
        if rec["quick"]:
            print(f"skipped {path.name}: quick mode")
            continue
        if not str(rec["device"]).startswith(("cuda", "mps")) or not rec["hardware"].get("gpus", rec["device"] == "mps"):
            print(f"refused {path.name}: measured on {rec['device']!r}, not a GPU (references are GPU results)")
            continue
        if rec.get("stopped"):
            print(f"refused {path.name}: the notebook was stopped at its time limit (its results are partial)")
            continue
        target = reference_dir() / rec["hardware"]["name"] / path.name
        if target.exists() and not args.force:
            print(f"skipped {path.name}: {target} exists (use --force)")
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        budget = f" (sized to a time budget of {rec['budget_s']:.0f} s: smaller than a full run)" if rec.get("budget_s") else ""
        print(f"{path.name} -> {target}{budget}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
