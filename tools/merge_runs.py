"""Merge two or more course runs (e.g. two halves of `make gpu-check ONLY=...`) into one folder and one report.

Copies every run's results/*.json and executed notebooks into OUT_ALL, merges their times.json (a notebook run in
several keeps its latest run) and writes one report.md. The runs must come from the same machine and mode:
merging a GPU half with a CPU half would make one report of two machines.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from helpers.results import atomic_write_text
from run_course import write_report  # noqa: E402 beside this script


def merge(sources: list[Path], out: Path) -> Path:
    """Merge the run folders ``sources`` into ``out``; return the report's path. Raises ValueError on a mismatch."""
    times = [json.loads((s / "times.json").read_text(encoding="utf-8")) for s in sources]
    kinds = {(t["machine"], t["quick"]) for t in times}
    if len(kinds) > 1:
        raise ValueError("the runs come from different machines or modes: "
                         + "; ".join(f"{s}: {t['machine']}, quick={t['quick']}" for s, t in zip(sources, times)))
    merged = dict(times[0], notebooks={}, runs={}, merged_from=[str(s) for s in sources])
    merged["budget_s"] = sum(t.get("budget_s") or 0 for t in times) or None
    for src, t in zip(sources, times):
        merged["notebooks"].update(t.get("notebooks", {}))
        merged["runs"].update(t.get("runs", {}))
        for sub in ("results", "notebooks", "logs"):
            if (src / sub).is_dir():
                shutil.copytree(src / sub, out / sub, dirs_exist_ok=True)
    for name, run in merged["runs"].items():  # a notebook that ran to the end in one run counts as such
        if run.get("status") != "ok":
            merged["notebooks"].pop(name, None)
    merged["runs"] = dict(sorted(merged["runs"].items()))
    merged["notebooks"] = dict(sorted(merged["notebooks"].items()))
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "times.json", json.dumps(merged, indent=1))
    return write_report(out / "results", out / "report.md", runs=merged["runs"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="run folders, each with times.json (OUT of make gpu-check or make run)")
    ap.add_argument("--out", required=True, help="the merged folder")
    args = ap.parse_args(argv)
    sources = [Path(r).resolve() for r in args.runs]
    missing = [str(s) for s in sources if not (s / "times.json").exists()]
    if missing:
        print(f"error: no times.json in {', '.join(missing)}: give the OUT folders of finished runs", file=sys.stderr)
        return 2
    try:
        report = merge(sources, Path(args.out).resolve())
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"merged {len(sources)} runs into {args.out}; report: {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
