"""Execute the course's notebooks with papermill and write times.json and report.md (`make run`).

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

import argparse
import contextlib
import datetime
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

from helpers.devices import cpu_bf16_native, describe, pick_device
from helpers.results import atomic_write_text, load_results

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


def to_run(args) -> list[Path]:
    """The notebooks ``--only`` and ``--notebooks`` name, less those ``--skip`` names (each said, with its reason)."""
    todo = notebooks(args.only, Path(args.notebooks).resolve() if args.notebooks else None)
    skip = {p.strip() for p in args.skip.split(",") if p.strip()}
    for nb in [nb for nb in todo if nb.name[:2] in skip]:
        print(f"{nb.name}: {args.skip_reason}", flush=True)
    return [nb for nb in todo if nb.name[:2] not in skip]


def device_kind(hw: dict, device: str) -> str:
    """What floors are kept per: ``cpu``, ``mps``, or the CUDA GPU's name (``NVIDIA H200``)."""
    if device.startswith("cuda"):  # a dry run on a machine without the GPU: a kind never recorded
        index = int(device.split(":")[1]) if ":" in device else 0
        return hw["gpus"][min(index, len(hw["gpus"]) - 1)]["name"] if hw.get("gpus") else "cuda"
    return "mps" if device == "mps" else "cpu"


def load_floors(kind: str = "cpu", path: Path = FLOORS) -> tuple[dict, str, bool]:
    """``({prefix: seconds}, where they come from, whether they are this kind's own)``: each notebook's time as
    budget_s approaches 0, recorded per device kind (``--measure-floors``, ``tools/promote_reference.py``). A kind
    never recorded gets the CPU's floors, which the run scales down as its first notebooks finish (``learn``)."""
    if not path.exists():
        return {}, f"no floors recorded ({DEFAULT_FLOOR_S:.0f} s assumed each)", False
    kinds = json.loads(path.read_text(encoding="utf-8"))["kinds"]
    own = kind in kinds
    entry = kinds[kind] if own else kinds["cpu"]
    floors = {k[:2]: float(v) for k, v in kinds["cpu"]["floors_s"].items()}  # a notebook the kind lacks: the CPU's
    floors.update({k[:2]: float(v) for k, v in entry["floors_s"].items()})
    where = f"{entry['machine']}, torch {entry['torch']}, {entry['date']}"
    if own:
        return floors, f"floors of {kind} ({where}; the CPU's for a notebook it has none of)", True
    return floors, (f"no floors recorded for {kind}: planning from the CPU's ({where}), scaled down as the first "
                    "notebooks show how much faster this device is"), False


def learn(floors: dict, runs: dict) -> tuple[dict, float]:
    """Floors of a device kind never recorded, learned from this run: the CPU's floors times the largest ratio of
    time taken to CPU floor among the notebooks that finished (at most 1: a notebook that took longer than its CPU
    floor was given more work, so it says nothing about its floor)."""
    ratios = [r["seconds"] / floors[k[:2]] for k, r in runs.items() if r["status"] == "ok" and floors.get(k[:2])]
    scale = min(1.0, max(ratios)) if ratios else 1.0
    return {k: v * scale for k, v in floors.items()}, scale


def overrun(runs: dict) -> float:
    """How many times their ``budget_s`` the notebooks that ended so far took, at least 1: a notebook's fixed costs
    (its kernel's start, imports, cold caches) are not all in its floor, and a slower machine runs everything
    longer, so the rest of the run is planned in that unit."""
    done = [r for r in runs.values() if r["status"] == "ok" and r.get("budget_s")]
    return max(1.0, sum(r["seconds"] for r in done) / sum(r["budget_s"] for r in done)) if done else 1.0


def fit(prefixes: list[str], left_s: float, floors: dict) -> list[str]:
    """The notebooks (in order) whose floors fit in ``left_s``: the largest floors are left out first, so as many
    notebooks as possible run."""
    kept = list(prefixes)
    while kept and sum(floors.get(p, DEFAULT_FLOOR_S) for p in kept) > left_s:
        kept.remove(max(reversed(kept), key=lambda p: floors.get(p, DEFAULT_FLOOR_S)))
    return kept


def split(prefixes: list[str], left_s: float, floors: dict) -> list[list[str]]:
    """``ONLY=`` groups that each fit ``left_s``: the run's own (``fit``), then the rest packed largest first."""
    groups = [fit(prefixes, left_s, floors)]
    for p in sorted((p for p in prefixes if p not in groups[0]), key=lambda p: -floors.get(p, DEFAULT_FLOOR_S)):
        room = [g for g in groups[1:] if sum(floors.get(q, DEFAULT_FLOOR_S) for q in g + [p]) <= left_s]
        (room[0].append(p) if room else groups.append([p]))
    return [sorted(g) for g in groups if g]


def plan_budget(prefix: str, rest: list[str], left_s: float, floors: dict) -> float:
    """``budget_s`` for notebook ``prefix``: its floor plus its weight's part of what ``left_s`` leaves after the
    floors of every notebook in ``rest`` (which includes ``prefix``; ``fit`` chose them, so the floors fit)."""
    floor = {p: floors.get(p, DEFAULT_FLOOR_S) for p in rest}
    spare = max(0.0, left_s - sum(floor.values()))
    weight = {p: BUDGET_SHARE.get(p, 0.05) for p in rest}
    return floor[prefix] + spare * weight[prefix] / sum(weight.values())


def time_limit(budget_s: float, deadline_left: float | None, rest_floors: float,
               grace: float = LIMIT_GRACE_S) -> float:
    """Seconds a notebook with ``budget_s`` may run before it is stopped: LIMIT_FACTOR × budget_s + ``grace``, and
    never so long that the floors of the notebooks after it (``rest_floors``) no longer fit before the deadline."""
    limit = LIMIT_FACTOR * budget_s + grace
    if deadline_left is not None:
        limit = min(limit, deadline_left - rest_floors)
    return limit


def start(prefix: str, rest: list[str], left_s: float, deadline_left: float | None, floors: dict,
          grace: float = LIMIT_GRACE_S) -> tuple[float, float] | None:
    """``(budget_s, limit_s)`` for the notebook about to start, or None when it does not fit: it never starts with
    a budget below its floor or a limit below LIMIT_FACTOR × its budget."""
    rest_floors = sum(floors.get(p, DEFAULT_FLOOR_S) for p in rest if p != prefix)
    if rest_floors + floors.get(prefix, DEFAULT_FLOOR_S) > left_s:
        return None
    budget = plan_budget(prefix, rest, left_s, floors)
    if deadline_left is not None:  # room for LIMIT_FACTOR x budget before the deadline, the later floors kept
        budget = min(budget, (deadline_left - rest_floors) / LIMIT_FACTOR)
    if budget < floors.get(prefix, DEFAULT_FLOOR_S) or budget <= 0:
        return None
    return budget, time_limit(budget, deadline_left, rest_floors, grace)


def next_notebook(prefixes: list[str], left_s: float, deadline_left: float | None, floors: dict,
                  grace: float = LIMIT_GRACE_S) -> tuple[float, float] | None:
    """``start`` for ``prefixes[0]``, the notebooks left being ``prefixes``: None when it is not among those whose
    floors fit the time left (``fit``) or cannot start (``start``)."""
    rest = fit(prefixes, left_s, floors)
    return start(prefixes[0], rest, left_s, deadline_left, floors, grace) if prefixes[0] in rest else None


def run_one(nb: Path, target: Path, params: dict, limit_s: float | None, log: Path) -> dict:
    """Run ``nb`` into ``target`` in its own session; stop its process tree after ``limit_s``. Returns its status."""
    status_file = target.with_suffix(".status.json")
    status_file.unlink(missing_ok=True)
    t0 = time.perf_counter()
    with open(log, "w", encoding="utf-8") as fh:
        proc = subprocess.Popen([sys.executable, str(RUNNER), str(nb), str(target), json.dumps(params),
                                 str(status_file)], stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
                                env=dict(os.environ, COURSE_STARTED=str(time.time())))  # budget_s counts from here
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


def machine_name(hw: dict) -> str:
    """The machine in one phrase: ``1x NVIDIA H200`` or ``2-core AMD EPYC with bf16``."""
    gpus = [g["name"] for g in hw["gpus"]]
    return (f"{len(gpus)}x {gpus[0]}" if gpus else
            f"{hw['cpu_cores']}-core {hw['cpu']} {'with' if cpu_bf16_native() else 'without'} bf16")


def write_times(path: Path, runs: dict, hw: dict, quick: bool, budget_s: float | None, kind: str = "cpu") -> None:
    """The notebooks' wall-clock seconds with the machine, mode and how each ended, each with the floor its plan used
    (tools/course_times.py --record reads ``notebooks``: the seconds of the notebooks that ran to the end;
    tools/promote_reference.py keeps a GPU run's times as that GPU's floors)."""
    atomic_write_text(path, json.dumps({
        "machine": machine_name(hw), "gpu": bool(hw["gpus"]), "kind": kind, "torch": hw["torch"], "quick": quick,
        "date": datetime.date.today().isoformat(), "budget_s": budget_s,
        "notebooks": {k: round(r["seconds"], 1) for k, r in runs.items() if r["status"] == "ok"},
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
    ap.add_argument("--floors", default=str(FLOORS),
                    help="the floors per device kind (default: data/budget_floors.json)")
    ap.add_argument("--plan", action="store_true",
                    help="a dry run: print each notebook's budget and limit and when the run ends; run nothing")
    return ap.parse_args(argv)


def _terminate(signum, frame):
    raise SystemExit(128 + signum)  # so a `kill` of the runner also stops the notebook's tree (run_one)


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        items = list(value.items())
        text = ", ".join(f"{k}: {_fmt(v)}" for k, v in items[:8])
        return "{" + text + (", …" if len(items) > 8 else "") + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_fmt(v) for v in value[:10]) + (", …" if len(value) > 10 else "") + "]"
    return str(value)


def _runs_table(runs: dict) -> list[str]:
    """How each notebook of a run ended (``tools/run_course.py``): status, seconds, budget, limit, message."""
    lines = ["| notebook | ended | seconds | budget_s | limit (s) | note |", "|---|---|---|---|---|---|"]
    for name, r in runs.items():
        cells = [r.get("seconds"), r.get("budget_s"), r.get("limit_s")]
        nums = " | ".join("" if v is None else f"{v:.0f}" for v in cells)
        note = " ".join(str(r.get(k, "")) for k in ("message", "cell") if r.get(k)).replace("|", "/")
        lines.append(f"| {name} | {r['status']} | {nums} | {note[:200]} |")
    return lines + [""]


def _process_table() -> dict:
    """``{pid: (parent pid, session id)}`` of every process, from ``/proc`` (Linux); empty where there is none."""
    table = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()  # the command name may hold spaces and ')'
        except OSError:
            continue
        table[int(entry)] = (int(fields[1]), int(fields[3]))
    return table


def process_tree(pid: int) -> list:
    """``pid``, every process it started (children of children too), and every process of its session."""
    table = _process_table()
    session = table.get(pid, (None, None))[1]
    found, todo = [], [pid]
    found += [p for p, (_, sid) in table.items() if sid == session and p != pid and session is not None]
    while todo:
        parent = todo.pop()
        if parent not in found:
            found.append(parent)
        todo += [p for p, (ppid, _) in table.items() if ppid == parent and p not in found]
    return [p for p in found if p in table or p == pid]


def kill_tree(pid: int) -> list:
    """Stop ``pid`` and everything it started — a Jupyter kernel and the ``torchrun`` ranks it launched included
    (a notebook past its time limit is stopped with it).

    The tree is frozen first (SIGSTOP), looked up again for anything started meanwhile, then killed: a parent
    killed first would leave its children to ``init``, out of reach. Without ``/proc`` (macOS) the process group
    of ``pid`` is killed instead. Returns the pids signalled.
    """
    if not os.path.isdir("/proc"):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        return [pid]
    me, seen = os.getpid(), []
    for _ in range(3):  # freeze, look again, until nothing new appears
        new = [p for p in process_tree(pid) if p not in seen and p != me]
        if not new:
            break
        for p in new:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGSTOP)
        seen += new
    for p in seen:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, signal.SIGKILL)
    return seen


def write_report(results: Path, out: Path, *, runs: dict | None = None) -> Path:
    """Collect every ``build/results/*.json`` into ``build/report.md`` (``make run``, ``make gpu-check``,
    tools/merge_runs.py); ``runs`` adds how each notebook ended — a notebook stopped at its time limit may have saved
    none."""
    src, out = Path(results), Path(out)
    lines = ["# Course run report", ""] + (_runs_table(runs) if runs else [])
    records = [load_results(p) for p in sorted(src.glob("*.json"))]
    if not records:
        lines.append(f"No results found in `{src}`.")
    for rec in records:
        hw = rec["hardware"]
        gpus = ", ".join(g["name"] for g in hw.get("gpus", [])) or "no GPU"
        lines += [
            f"## {rec['notebook']}",
            "",
            f"- Hardware: `{hw.get('name')}` — {hw.get('cpu')} ({hw.get('cpu_cores')} cores); {gpus}; "
            f"torch {hw.get('torch')}",
            f"- Device: `{rec['device']}`, quick mode: {rec['quick']}, recorded {rec['timestamp']}"
            + (f", sized to a budget of {rec['budget_s']:.0f} s" if rec.get("budget_s") else "")
            + (" — STOPPED at its time limit: partial results" if rec.get("stopped") else
               " — partial: saved before the notebook's end" if rec.get("partial") else ""),
            "",
            "| result | value |",
            "|---|---|",
        ]
        lines += [f"| `{k}` | {_fmt(v)} |" for k, v in rec["results"].items()]
        lines.append("")
    atomic_write_text(out, "\n".join(lines) + "\n")
    return out


def main(argv=None) -> int:
    signal.signal(signal.SIGTERM, _terminate)
    args = _parse(argv)
    budget = args.budget_s if args.budget_s is not None else (60 * args.budget_min if args.budget_min else None)
    if args.plan:  # the dry run needs neither the device nor a folder
        return dry_run(to_run(args), budget, args.deadline, device_kind(describe(), args.device), args.limit_grace,
                       Path(args.floors))
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
    todo = to_run(args)
    kind = device_kind(hw, str(pick_device(args.device)))
    gpus = ", ".join(g["name"] for g in hw["gpus"]) or "no GPU"
    print(f"Running {len(todo)} notebook(s) in {'quick' if args.quick else 'full'} mode on device={args.device} "
          f"({hw['cpu']}; {gpus})" + (f", budget {budget:.0f} s" if budget else ""), flush=True)
    start = time.perf_counter()
    runs: dict = {}
    try:
        code = _run_all(args, todo, out, budget, runs, kind)
    finally:  # always: the times and the report of what ran
        write_times(out / "times.json", runs, hw, args.quick, budget, kind)
        report = write_report(results, out / "report.md", runs=runs)
    if args.measure_floors:
        write_floors(runs, hw, kind)
    if bad := [k for k, r in runs.items() if r["status"] != "ok"]:
        print(f"{len(bad)} of {len(todo)} notebook(s) did not end normally: "
              + ", ".join(f"{k} ({runs[k]['status']})" for k in bad) + f"; report of all: {report}")
        return 1
    print(f"All {len(todo)} notebook(s) ran in {time.perf_counter() - start:.0f} s. "
          f"Executed notebooks: {out / 'notebooks'}; report: {report}")
    return code


def _run_all(args, todo: list, out: Path, budget: float | None, runs: dict, kind: str) -> int:
    cpu_floors, source, own = load_floors(kind, Path(args.floors))
    floors = cpu_floors
    t_start = time.perf_counter()
    deadline_left = (lambda: args.deadline - time.time()) if args.deadline else (lambda: None)
    prefixes = [nb.name[:2] for nb in todo]
    if budget and not args.measure_floors:
        print(f"plan: {source}", flush=True)
        announce(prefixes, budget, floors, own)
    for i, nb in enumerate(todo, 1):
        target, prefix = out / "notebooks" / nb.name, nb.name[:2]
        result_file = out / "results" / f"{nb.stem}.json"
        result_file.unlink(missing_ok=True)
        params, limit = {"quick": args.quick, "device": args.device}, None
        if args.measure_floors:
            params["budget_s"] = 1
        elif budget:
            if not own:  # a kind never recorded: what the notebooks so far took tells how fast this device is
                floors, _ = learn(cpu_floors, runs)
            ratio = overrun(runs)  # the notebooks so far took this many times their budget_s: plan the rest so
            left = (budget - (time.perf_counter() - t_start)) / ratio  # (a cold start, a slower machine)
            late = None if deadline_left() is None else deadline_left() / ratio
            planned = next_notebook(prefixes[i - 1:], left, late, floors, args.limit_grace)
            if ratio > 1 and planned is not None:
                print(f"plan: the notebooks so far took {ratio:.2f}× their budget_s; the rest are planned for that",
                      flush=True)
            if planned is None:
                runs[nb.stem] = {"status": "not run: budget", "seconds": 0.0,
                                 "floor_s": floors.get(prefix, DEFAULT_FLOOR_S),
                                 "message": f"its floor of {floors.get(prefix, DEFAULT_FLOOR_S):.0f} s did not fit the "
                                            f"{max(left, 0):.0f} s left with the notebooks after it"}
                print(f"[{i}/{len(todo)}] {nb.name}: not run: budget ({runs[nb.stem]['message']})", flush=True)
                continue
            params["budget_s"], limit = round(planned[0], 2), planned[1]
        print(f"[{i}/{len(todo)}] {nb.name} ..." + (f" (budget {params['budget_s']:.0f} s, limit {limit:.0f} s)"
                                                    if limit else ""), end=" ", flush=True)
        run = run_one(nb, target, params, limit, out / "logs" / f"{nb.stem}.log")
        run.update(budget_s=params.get("budget_s"), limit_s=limit)
        if budget and not args.measure_floors:
            run["floor_s"] = round(floors.get(prefix, DEFAULT_FLOOR_S), 1)
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


def announce(prefixes: list[str], budget: float, floors: dict, own: bool = True) -> None:
    """Before the first notebook: one line naming what will not fit on these floors and the ONLY= split that would."""
    groups = split(prefixes, budget, floors)
    if len(groups) == 1:
        return
    left_out = [p for p in prefixes if p not in groups[0]]
    total = sum(floors.get(p, DEFAULT_FLOOR_S) for p in prefixes)
    print(f"plan: the floors of these notebooks add up to {total:.0f} s, more than the {budget:.0f} s given: "
          + ", ".join(f"{p} ({floors.get(p, DEFAULT_FLOOR_S):.0f} s)" for p in left_out)
          + (" will not fit and are listed as 'not run: budget'" if own else
             " will not fit unless the first notebooks show this device to be faster than these floors")
          + "; to run them all, split the run: " + " and ".join("ONLY=" + ",".join(g) for g in groups)
          + " (one session each, then tools/merge_runs.py)", flush=True)


def plan_run(prefixes: list[str], budget: float, deadline_left: float | None, floors: dict,
             grace: float = LIMIT_GRACE_S, took=lambda budget_s, limit_s: budget_s) -> list[dict]:
    """The run as planned, notebook by notebook: ``{"prefix", "floor_s", "budget_s", "limit_s", "at_s"}`` (budget and
    limit None: not run), when each notebook takes ``took(budget_s, limit_s)`` seconds (tests pass the limit)."""
    at, plan = 0.0, []
    for i, prefix in enumerate(prefixes):
        planned = next_notebook(prefixes[i:], budget - at, None if deadline_left is None else deadline_left - at,
                                floors, grace)
        if planned is not None:
            at += took(*planned)
        plan.append({"prefix": prefix, "floor_s": floors.get(prefix, DEFAULT_FLOOR_S),
                     "budget_s": planned and planned[0], "limit_s": planned and planned[1], "at_s": at})
    return plan


def dry_run(todo: list, budget: float | None, deadline: float | None, kind: str, grace: float,
            floors_file: Path = FLOORS) -> int:
    """Print each notebook's budget and limit and when the run would end, running nothing (``--plan``). It assumes
    each notebook takes its budget_s; a kind with no floors of its own re-plans as its first notebooks finish."""
    if not budget:
        print("plan: no budget given (--budget-min or --budget-s): every notebook runs to its end, with no limit")
        return 0
    floors, source, own = load_floors(kind, floors_file)
    now = time.time()
    print(f"plan: {source}")
    announce([nb.name[:2] for nb in todo], budget, floors, own)
    clock = lambda t: datetime.datetime.fromtimestamp(now + t).strftime("%H:%M:%S")  # noqa: E731
    steps = plan_run([nb.name[:2] for nb in todo], budget, None if deadline is None else deadline - now, floors, grace)
    for i, (nb, step) in enumerate(zip(todo, steps), 1):
        print(f"[{i}/{len(todo)}] {nb.name}: floor {step['floor_s']:.0f} s, " + (
            f"budget {step['budget_s']:.0f} s, limit {step['limit_s']:.0f} s, ends about {clock(step['at_s'])}"
            if step["budget_s"] else "not run: budget"))
    end = steps[-1]["at_s"] if steps else 0.0
    print(f"plan: the notebooks end about {clock(end)} ({end:.0f} s of {budget:.0f} s)"
          + (f"; none runs past {datetime.datetime.fromtimestamp(deadline):%H:%M:%S}" if deadline else ""))
    return 0


FLOORS_ABOUT = ("Per device kind (cpu, mps, or the CUDA GPU's name): each notebook's wall-clock seconds in full mode "
                "as budget_s approaches 0 (start-up, data, fixed demonstrations). tools/run_course.py --measure-floors "
                "measures them (budget_s=1); tools/promote_reference.py keeps a GPU run's times as that GPU's floors "
                "(an upper bound: a notebook given more than its floor did more work). tools/run_course.py plans a "
                "time budget from the floors of the kind it runs on.")


LARGER = "the larger floor of: "


def record_floors(kind: str, floors_s: dict, machine: str, torch_version: str, how: str,
                  path: Path = FLOORS) -> None:
    """Keep ``floors_s`` ({notebook: seconds}) as ``kind``'s floors in data/budget_floors.json. A notebook already
    recorded keeps: on the CPU, the larger of its measured floors (CPU machines differ, and the plan must hold on the
    slowest measured); on a GPU, a new measurement, or else the smaller of two runs' times (each an upper bound)."""
    data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {"kinds": {}}
    entry = data["kinds"].setdefault(kind, {"floors_s": {}})
    measured, today = how.startswith("measured"), datetime.date.today().isoformat()
    keep = max if kind == "cpu" and measured else (lambda old, new: new) if measured else min
    for name, seconds in floors_s.items():
        old = entry["floors_s"].get(name)
        entry["floors_s"][name] = round(seconds if old is None else keep(old, seconds), 1)
    if kind == "cpu" and measured and entry.get("machine"):  # each machine named once, with its latest date
        was = entry["machine"]
        was = was.removeprefix(LARGER) if was.startswith(LARGER) else f"{was} ({entry.get('date')})"
        named = {**dict(m.rsplit(" (", 1) for m in was.split("; ")), machine: f"{today})"}
        machine = f"{LARGER}{'; '.join(f'{m} ({d}' for m, d in named.items())}" if len(named) > 1 else machine
    how = entry["how"] if entry.get("how", "").startswith(how) else how  # keeps a note added after it
    entry.update(machine=machine, torch=torch_version, date=today, how=how)
    data["about"] = FLOORS_ABOUT
    atomic_write_text(path, json.dumps(dict(about=data.pop("about"), **data), indent=1) + "\n")


def write_floors(runs: dict, hw: dict, kind: str) -> None:
    """Record a --measure-floors run as ``kind``'s floors (every notebook must have ended normally)."""
    if bad := [k for k, r in runs.items() if r["status"] != "ok"]:
        print(f"floors not written: {', '.join(bad)} did not end normally", file=sys.stderr)
        return
    record_floors(kind, {k: r["seconds"] for k, r in runs.items()}, machine_name(hw), hw["torch"],
                  "measured: tools/run_course.py --measure-floors (budget_s=1)")
    print(f"floors of {kind} written to {FLOORS}")


if __name__ == "__main__":
    sys.exit(main())
