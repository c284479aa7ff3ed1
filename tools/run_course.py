"""Execute the course's notebooks with papermill and write times.json and report.md (`make run`).

    python tools/run_course.py [--quick] [--device auto|cpu|cuda|cuda:N|mps] [--only 00,01] [--out build]
                               [--budget-min 8 | --budget-s 480] [--deadline EPOCH_SECONDS] [--skip 04,05]
                               [--keep-going] [--measure-floors]

Each notebook runs in a fresh `python3` kernel with `notebooks/` as its working directory (as in JupyterLab),
driven by tools/run_notebook.py in a process session of its own. Without --keep-going the run stops at the first
failing notebook and names it and the failing cell.

With a budget (--budget-min, or --budget-s from `make gpu-check`), every notebook gets
- a `budget_s` parameter: its measured floor (data/budget_floors.json: its time as budget_s approaches 0) plus a
  weighted share of what the floors leave, re-divided at each notebook's start over the notebooks still to run
  (so time one notebook leaves unused goes to the others, and ONLY= renormalises by itself);
- a hard limit of LIMIT_FACTOR × budget_s + LIMIT_GRACE_S (never past --deadline less the floors still to run):
  a notebook past it is stopped with its whole process tree (kernel, torchrun ranks), recorded as "stopped" with
  what it saved, and the run goes on.
Every ending — error in a cell, dead kernel, a kernel that never starts, a stop — is one line; times.json (with a
status per notebook) and report.md are always written.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNNER = Path(__file__).resolve().parent / "run_notebook.py"
FLOORS = Path(__file__).resolve().parent.parent / "data" / "budget_floors.json"

from helpers.devices import describe, pick_device
from helpers.launcher import kill_tree
from helpers.results import atomic_write_text, write_report

# Weights of the time left after the floors (the part a notebook spends on its scalable work): the CIFAR lessons
# train, 05 trains two recipes (the rehearsal of 2026-12-05 left them 3 s each at 0.27). Renormalised over the
# notebooks that run.
BUDGET_SHARE = {"00": 0.02, "01": 0.06, "02": 0.06, "03": 0.04, "04": 0.06, "05": 0.32, "06": 0.08, "07": 0.10,
                "08": 0.07, "09": 0.07, "10": 0.05, "11": 0.07}
DEFAULT_FLOOR_S = 30.0   # a notebook with no measured floor
LIMIT_FACTOR, LIMIT_GRACE_S = 1.3, 30.0  # a notebook is stopped past 1.3 x its budget_s + 30 s


def notebooks(only: str | None, folder: Path | None = None) -> list[Path]:
    folder = folder or ROOT / "notebooks"
    found = sorted(folder.glob("[0-9][0-9]_*.ipynb"))
    if only:
        wanted = [w.strip() for w in only.split(",") if w.strip()]
        found = [nb for nb in found if any(nb.name.startswith(w) for w in wanted)]
        if not found:
            raise SystemExit(f"error: --only {only!r} matches no notebook in {folder}")
    return found


def load_floors(path: Path = FLOORS) -> dict:
    """``{prefix: seconds}``: each notebook's measured time as budget_s approaches 0 (``--measure-floors``)."""
    if not path.exists():
        return {}
    return {k[:2]: float(v) for k, v in json.loads(path.read_text(encoding="utf-8"))["floors_s"].items()}


def plan_budget(prefix: str, rest: list[str], left_s: float, floors: dict) -> float:
    """``budget_s`` for notebook ``prefix``: its floor plus its weight's part of what ``left_s`` leaves after the
    floors of every notebook in ``rest`` (which includes ``prefix``). Below the floors, the floors shrink alike."""
    floor = {p: floors.get(p, DEFAULT_FLOOR_S) for p in rest}
    spare = left_s - sum(floor.values())
    if spare <= 0:
        return max(1.0, left_s * floor[prefix] / sum(floor.values()))
    weight = {p: BUDGET_SHARE.get(p, 0.05) for p in rest}
    return floor[prefix] + spare * weight[prefix] / sum(weight.values())


def time_limit(budget_s: float, deadline: float | None, rest_floors: float, grace: float = LIMIT_GRACE_S) -> float:
    """Seconds a notebook with ``budget_s`` may run before it is stopped (within the run's ``deadline``)."""
    limit = LIMIT_FACTOR * budget_s + grace
    if deadline is not None:
        limit = min(limit, deadline - time.time() - rest_floors)
    return max(5.0, limit)


def run_one(nb: Path, target: Path, params: dict, limit_s: float | None, log: Path) -> dict:
    """Run ``nb`` into ``target`` in its own session; stop its process tree after ``limit_s``. Returns its status."""
    status_file = target.with_suffix(".status.json")
    status_file.unlink(missing_ok=True)
    t0 = time.perf_counter()
    with open(log, "w", encoding="utf-8") as fh:
        proc = subprocess.Popen([sys.executable, str(RUNNER), str(nb), str(target), json.dumps(params),
                                 str(status_file)], stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            proc.wait()
            return {"status": "stopped", "seconds": time.perf_counter() - t0,
                    "message": f"stopped at its time limit of {limit_s:.0f} s (budget_s {params.get('budget_s')})"}
        except BaseException:  # Ctrl-C: no kernel or torchrun rank outlives the run
            kill_tree(proc.pid)
            raise
    seconds = time.perf_counter() - t0
    if status_file.exists():
        status = json.loads(status_file.read_text(encoding="utf-8"))
        status_file.unlink()
    else:
        status = {"status": "died", "message": f"the notebook runner ended with exit code {proc.returncode} "
                                              f"and no status (killed? out of memory?); its log: {log}"}
    return dict(status, seconds=seconds)


def mark_results(path: Path, run: dict) -> None:
    """Add how the notebook ended to the results file it wrote (if any): promote_reference reads it."""
    if not path.exists():
        return
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except ValueError:
        return
    record["stopped"] = run["status"] == "stopped"
    record.setdefault("budget_s", run.get("budget_s"))
    atomic_write_text(path, json.dumps(record, indent=2) + "\n")


def write_times(path: Path, runs: dict, hw: dict, quick: bool, budget_s: float | None) -> None:
    """The notebooks' wall-clock seconds with the machine, mode and how each ended (tools/course_times.py --record
    reads ``notebooks``: the seconds of the notebooks that ran to the end)."""
    import datetime

    from helpers.devices import cpu_bf16_native

    gpus = [g["name"] for g in hw["gpus"]]
    machine = (f"{len(gpus)}x {gpus[0]}" if gpus else
               f"{hw['cpu_cores']}-core {hw['cpu']} {'with' if cpu_bf16_native() else 'without'} bf16")
    atomic_write_text(path, json.dumps({
        "machine": machine, "gpu": bool(gpus), "quick": quick, "date": datetime.date.today().isoformat(),
        "budget_s": budget_s, "notebooks": {k: round(r["seconds"], 1) for k, r in runs.items() if r["status"] == "ok"},
        "runs": {k: {n: (round(v, 1) if isinstance(v, float) else v) for n, v in r.items()} for k, r in runs.items()},
    }, indent=1))


def _parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="quick mode: small sizes, few epochs")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N | mps")
    ap.add_argument("--only", default=None, help="comma-separated notebook prefixes, e.g. 00,01")
    ap.add_argument("--notebooks", default=None, help="the folder of notebooks (default: notebooks/)")
    ap.add_argument("--out", default=str(ROOT / "build"), help="folder for executed notebooks, results, report")
    ap.add_argument("--keep-going", action="store_true", help="run the remaining notebooks after a failure")
    ap.add_argument("--budget-min", type=float, default=None,
                    help="size every notebook's work to finish the notebooks in about this many minutes (budget_s)")
    ap.add_argument("--budget-s", type=float, default=None, help="the same in seconds (make gpu-check)")
    ap.add_argument("--deadline", type=float, default=None,
                    help="wall-clock time (seconds since the epoch) no notebook may run past (make gpu-check)")
    ap.add_argument("--limit-grace", type=float, default=LIMIT_GRACE_S,
                    help=f"seconds a notebook may run past {LIMIT_FACTOR} x its budget_s before it is stopped")
    ap.add_argument("--measure-floors", action="store_true",
                    help="run every notebook with budget_s=1 and no time limit, and write data/budget_floors.json")
    ap.add_argument("--skip", default="", help="comma-separated notebook prefixes not to run, with the reason printed")
    ap.add_argument("--skip-reason", default="skipped", help="the reason printed for --skip")
    return ap.parse_args(argv)


def _terminate(signum, frame):
    raise SystemExit(128 + signum)  # so a `kill` of the runner also stops the notebook's tree (run_one)


def main(argv=None) -> int:
    signal.signal(signal.SIGTERM, _terminate)
    args = _parse(argv)
    try:
        pick_device(args.device)  # fail before starting any kernel
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out).resolve()
    for sub in ("notebooks", "logs"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    results = out / "results"
    os.environ["COURSE_RESULTS_DIR"] = str(results)
    hw = describe()
    todo = notebooks(args.only, Path(args.notebooks).resolve() if args.notebooks else None)
    skip = {p.strip() for p in args.skip.split(",") if p.strip()}
    for nb in [nb for nb in todo if nb.name[:2] in skip]:
        print(f"{nb.name}: {args.skip_reason}", flush=True)
    todo = [nb for nb in todo if nb.name[:2] not in skip]
    budget = args.budget_s if args.budget_s is not None else (60 * args.budget_min if args.budget_min else None)
    gpus = ", ".join(g["name"] for g in hw["gpus"]) or "no GPU"
    print(f"Running {len(todo)} notebook(s) in {'quick' if args.quick else 'full'} mode on device={args.device} "
          f"({hw['cpu']}; {gpus})" + (f", budget {budget:.0f} s" if budget else ""), flush=True)
    start = time.perf_counter()
    runs: dict = {}
    try:
        code = _run_all(args, todo, out, budget, runs)
    finally:  # always: the times and the report of what ran
        write_times(out / "times.json", runs, hw, args.quick, budget)
        report = write_report(results, out / "report.md", runs=runs)
    if args.measure_floors:
        write_floors(runs, hw)
    bad = [k for k, r in runs.items() if r["status"] != "ok"]
    if bad:
        print(f"{len(bad)} of {len(todo)} notebook(s) did not end normally: "
              + ", ".join(f"{k} ({runs[k]['status']})" for k in bad) + f"; report of all: {report}")
        return 1
    print(f"All {len(todo)} notebook(s) ran in {time.perf_counter() - start:.0f} s. "
          f"Executed notebooks: {out / 'notebooks'}; report: {report}")
    return code


def _run_all(args, todo: list, out: Path, budget: float | None, runs: dict) -> int:
    floors = load_floors()
    t_start = time.perf_counter()
    for i, nb in enumerate(todo, 1):
        target, prefix = out / "notebooks" / nb.name, nb.name[:2]
        result_file = out / "results" / f"{nb.stem}.json"
        result_file.unlink(missing_ok=True)
        params, limit = {"quick": args.quick, "device": args.device}, None
        rest = [n.name[:2] for n in todo[i - 1:]]
        if args.measure_floors:
            params["budget_s"] = 1
        elif budget:
            params["budget_s"] = round(plan_budget(prefix, rest, budget - (time.perf_counter() - t_start), floors), 1)
            limit = time_limit(params["budget_s"], args.deadline,
                               sum(floors.get(p, DEFAULT_FLOOR_S) for p in rest[1:]), args.limit_grace)
        print(f"[{i}/{len(todo)}] {nb.name} ..." + (f" (budget {params['budget_s']:.0f} s, limit {limit:.0f} s)"
                                                    if limit else ""), end=" ", flush=True)
        run = run_one(nb, target, params, limit, out / "logs" / f"{nb.stem}.log")
        run.update(budget_s=params.get("budget_s"), limit_s=limit)
        runs[nb.stem] = run
        mark_results(result_file, run)
        if run["status"] == "ok":
            print(f"done in {run['seconds']:.0f} s", flush=True)
            continue
        print(f"{run['status'].upper()} after {run['seconds']:.0f} s", flush=True)
        where = f" in {run['cell']}" if run.get("cell") else ""
        name = nb.relative_to(ROOT) if nb.is_relative_to(ROOT) else nb
        print(f"error: {name} {run['status']}{where}: {run['message']}\n"
              f"The executed notebook (what it saved) is {target}", file=sys.stderr, flush=True)
        if not args.keep_going:
            return 1
    return 0


def write_floors(runs: dict, hw: dict) -> None:
    """data/budget_floors.json from a --measure-floors run (every notebook must have ended normally)."""
    import datetime

    bad = [k for k, r in runs.items() if r["status"] != "ok"]
    if bad:
        print(f"floors not written: {', '.join(bad)} did not end normally", file=sys.stderr)
        return
    old = json.loads(FLOORS.read_text(encoding="utf-8")) if FLOORS.exists() else {"floors_s": {}}
    old["floors_s"].update({k: round(r["seconds"], 1) for k, r in runs.items()})
    old.update(about="Each notebook's wall-clock seconds in full mode with budget_s=1 (its floor: start-up, data, "
                     "fixed demonstrations), measured by tools/run_course.py --measure-floors; tools/run_course.py "
                     "divides a time budget from them.",
               machine=f"{hw['cpu_cores']}-core {hw['cpu']}; " + (", ".join(g["name"] for g in hw["gpus"]) or "no GPU"),
               torch=hw["torch"], date=datetime.date.today().isoformat())
    atomic_write_text(FLOORS, json.dumps(old, indent=1) + "\n")
    print(f"floors written to {FLOORS}")


if __name__ == "__main__":
    sys.exit(main())
