"""Execute the course's notebooks with papermill and write build/report.md (`make run`).

    python tools/run_course.py [--quick] [--device auto|cpu|cuda|cuda:N|mps] [--only 00,01] [--out build]
                               [--budget-min 8] [--skip 04,05]

Each notebook runs in a fresh `python3` kernel with `notebooks/` as its working directory (as in
JupyterLab). The run stops at the first failing notebook and names it and the failing cell.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from helpers.devices import describe, pick_device
from helpers.results import write_report


# Share of a --budget-min time budget each notebook gets (its `budget_s` parameter); the CIFAR lessons train.
BUDGET_SHARE = {"00": 0.02, "01": 0.07, "02": 0.07, "03": 0.05, "04": 0.07, "05": 0.27, "06": 0.12, "07": 0.14,
                "08": 0.07, "09": 0.07, "10": 0.05}


def notebooks(only: str | None) -> list[Path]:
    found = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    if only:
        wanted = [w.strip() for w in only.split(",") if w.strip()]
        found = [nb for nb in found if any(nb.name.startswith(w) for w in wanted)]
        if not found:
            raise SystemExit(f"error: --only {only!r} matches no notebook in notebooks/")
    return found


def failing_cell(executed: Path) -> str:
    """Name the failing cell by its position in the *source* notebook and its first line."""
    import nbformat

    cells = [c for c in nbformat.read(executed, as_version=4).cells  # drop what papermill added
             if not {"injected-parameters", "papermill-error-cell-tag"} & set(c.metadata.get("tags", []))]
    for i, cell in enumerate(cells):
        if any(o.get("output_type") == "error" for o in cell.get("outputs", [])):
            first = next((line for line in cell.source.splitlines() if line.strip()), "")
            return f"cell {i + 1} (counting from 1, `{first[:60]}`)"
    return "a cell"


def write_times(path: Path, seconds: dict, hw: dict, quick: bool) -> None:
    """The notebooks' wall-clock seconds with the machine and mode (tools/course_times.py --record reads it)."""
    import datetime
    import json

    from helpers.devices import cpu_bf16_native
    from helpers.results import atomic_write_text

    gpus = [g["name"] for g in hw["gpus"]]
    machine = (f"{len(gpus)}x {gpus[0]}" if gpus else
               f"{hw['cpu_cores']}-core {hw['cpu']} {'with' if cpu_bf16_native() else 'without'} bf16")
    atomic_write_text(path, json.dumps({"machine": machine, "gpu": bool(gpus), "quick": quick,
                                        "date": datetime.date.today().isoformat(),
                                        "notebooks": {k: round(v, 1) for k, v in seconds.items()}}, indent=1))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="quick mode: small sizes, few epochs")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N | mps")
    ap.add_argument("--only", default=None, help="comma-separated notebook prefixes, e.g. 00,01")
    ap.add_argument("--out", default=str(ROOT / "build"), help="folder for executed notebooks, results, report")
    ap.add_argument("--keep-going", action="store_true", help="run the remaining notebooks after a failure")
    ap.add_argument("--budget-min", type=float, default=None,
                    help="size every notebook's work to finish the course in about this many minutes (budget_s)")
    ap.add_argument("--skip", default="", help="comma-separated notebook prefixes not to run, with the reason printed")
    ap.add_argument("--skip-reason", default="skipped", help="the reason printed for --skip")
    args = ap.parse_args(argv)
    try:
        pick_device(args.device)  # fail before starting any kernel
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import papermill as pm  # imported late: `--help` and bad input stay fast

    out = Path(args.out).resolve()
    (out / "notebooks").mkdir(parents=True, exist_ok=True)
    results = out / "results"
    os.environ["COURSE_RESULTS_DIR"] = str(results)
    hw = describe()
    gpus = ", ".join(g["name"] for g in hw["gpus"]) or "no GPU"
    todo = notebooks(args.only)
    skip = {p.strip() for p in args.skip.split(",") if p.strip()}
    for nb in [nb for nb in todo if nb.name[:2] in skip]:
        print(f"{nb.name}: {args.skip_reason}", flush=True)
    todo = [nb for nb in todo if nb.name[:2] not in skip]
    mode = "quick" if args.quick else "full"
    print(f"Running {len(todo)} notebook(s) in {mode} mode on device={args.device} ({hw['cpu']}; {gpus})", flush=True)
    start = time.perf_counter()
    failed, seconds = [], {}
    for i, nb in enumerate(todo, 1):
        target = out / "notebooks" / nb.name
        (results / f"{nb.stem}.json").unlink(missing_ok=True)
        print(f"[{i}/{len(todo)}] {nb.name} ...", end=" ", flush=True)
        t0 = time.perf_counter()
        try:
            params = {"quick": args.quick, "device": args.device}
            if args.budget_min:
                params["budget_s"] = round(60 * args.budget_min * BUDGET_SHARE.get(nb.name[:2], 0.05))
            pm.execute_notebook(str(nb), str(target), parameters=params, kernel_name="python3", cwd=str(nb.parent),
                                progress_bar=False)
        except pm.PapermillExecutionError as exc:
            print(f"FAILED after {time.perf_counter() - t0:.0f} s", flush=True)
            print(f"error: {nb.relative_to(ROOT)} failed in {failing_cell(target)}: "
                  f"{exc.ename}: {exc.evalue}\n"
                  f"The executed notebook with the full traceback is {target}", file=sys.stderr)
            failed.append(nb.name)
            if not args.keep_going:
                return 1
            continue
        seconds[nb.stem] = time.perf_counter() - t0
        print(f"done in {seconds[nb.stem]:.0f} s", flush=True)
    write_times(out / "times.json", seconds, hw, args.quick)
    report = write_report(results, out / "report.md")
    if failed:
        print(f"{len(failed)} of {len(todo)} notebook(s) failed: {', '.join(failed)}; report of the others: {report}")
        return 1
    print(f"All {len(todo)} notebook(s) ran in {time.perf_counter() - start:.0f} s. "
          f"Executed notebooks: {out / 'notebooks'}; report: {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
