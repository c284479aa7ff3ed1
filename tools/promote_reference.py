"""Copy results measured on real hardware into data/reference/<hardware-name>/ (after `make gpu-check`).

    python tools/promote_reference.py OUT/results [--force]
    python tools/promote_reference.py results-1x-Tesla-T4.zip      # what a lesson on Colab or Kaggle packed

Only full-mode results measured on a GPU are promoted (quick-mode figures and CPU runs are not references), never
those of a notebook stopped at its time limit; results sized to a time budget (`make gpu-check`) keep their
`budget_s`, which the notebooks print beside the figures.
Each file keeps the hardware, driver and torch version it was measured with; commit the new folder with a message
naming the machine. The datasheet predictions' error on that GPU goes with them (``gather_prediction_check``), and
the run's times become that GPU's budget floors (``keep_floors``).
"""
import argparse
import json
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from helpers.results import atomic_write_text, load_results, reference_dir
from run_course import FLOORS, record_floors  # noqa: E402 beside this script


def gather_prediction_check(folder: Path) -> Path | None:
    """Write ``folder/prediction_check.json``: ``{notebook: measured / predicted}`` from the promoted results that
    hold any, with the hardware they were measured on; None (and no file) when none holds a ratio."""
    found, hardware = {}, None
    for path in sorted(folder.glob("[0-9][0-9]_*.json")):
        rec = load_results(path)
        ratios = rec["results"].get("measured_over_predicted")
        if ratios and any(isinstance(v, (int, float)) or (isinstance(v, dict) and v) for v in ratios.values()):
            found[path.stem], hardware = ratios, rec["hardware"]
    if not found:
        return None
    target = folder / "prediction_check.json"
    atomic_write_text(target, json.dumps({"about": "measured / predicted from data/gpu_datasheet.json, per notebook "
                                          "(helpers.predictions): above 1, slower than predicted",
                                          "hardware": hardware, "notebooks": found}, indent=1) + "\n")
    return target


def keep_floors(times_path: Path, floors_path: Path = FLOORS) -> str:
    """Record a GPU run's notebook times (times.json of ``make gpu-check``) as its device kind's floors; say what."""
    if not times_path.exists():
        return f"floors: no {times_path.name} beside the results, none recorded"
    times = json.loads(times_path.read_text(encoding="utf-8"))
    kind = times.get("kind")
    if times.get("quick") or not times.get("gpu") or kind in (None, "cpu"):
        return "floors: only a full-mode GPU run's times become floors (this run's are not)"
    done = {k: r["seconds"] for k, r in times["runs"].items() if r["status"] == "ok"}
    if not done:
        return "floors: no notebook ended normally, none recorded"
    record_floors(kind, done, times["machine"], times.get("torch", "?"),
                  f"upper bound: times of a make gpu-check run ({times.get('date')})", floors_path)
    return f"floors of {kind} kept for {len(done)} notebook(s) in {floors_path}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", help="a folder of results JSON files (build/results or $OUT/results), or the zip a "
                    "hosted lesson packed (helpers.results.pack_results)")
    ap.add_argument("--force", action="store_true", help="replace existing reference files")
    args = ap.parse_args(argv)
    if args.results.endswith(".zip"):  # a learner's download (helpers.results.pack_results)
        with tempfile.TemporaryDirectory() as unpacked:
            with zipfile.ZipFile(args.results) as zf:
                zf.extractall(unpacked)
            return main([str(Path(unpacked) / "results")] + (["--force"] if args.force else []))
    files = sorted(Path(args.results).glob("[0-9][0-9]_*.json"))
    if not files:
        print(f"error: no results files in {args.results}", file=sys.stderr)
        return 2
    promoted = set()
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
        promoted.add(target.parent)
        budget = f" (sized to a time budget of {rec['budget_s']:.0f} s: smaller than a full run)" if rec.get("budget_s") else ""
        print(f"{path.name} -> {target}{budget}")
    for folder in sorted(promoted):
        check = gather_prediction_check(folder)
        print(f"measured / predicted: {check}" if check else f"measured / predicted: none in {folder} (the GPU is "
              "not in data/gpu_datasheet.json, or no notebook predicted it)")
    print(keep_floors(Path(args.results).resolve().parent / "times.json"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
