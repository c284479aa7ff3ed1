"""tools/course_times.py: every recorded time names the notebook version it measured; a stale one is shown as stale."""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
try:
    import course_times as ct
finally:
    sys.path.remove(str(ROOT / "tools"))

NB = "00_getting_started"


def _data() -> dict:
    return json.loads((ROOT / "data" / "course_times.json").read_text(encoding="utf-8"))


def _run(tmp: Path, stems: dict, *, gpu=False, quick=False, machine="2-core Test CPU without bf16",
         date="2026-12-05", executed: Path | None = None, status=None) -> Path:
    """A times.json as tools/run_course.py writes it, with the executed notebooks beside it when given."""
    tmp.mkdir(parents=True, exist_ok=True)
    runs = {k: {"status": (status or {}).get(k, "ok"), "seconds": s, "budget_s": None, "limit_s": None}
            for k, s in stems.items()}
    (tmp / "times.json").write_text(json.dumps({
        "machine": machine, "gpu": gpu, "quick": quick, "date": date, "budget_s": None,
        "notebooks": {k: s for k, s in stems.items() if runs[k]["status"] == "ok"}, "runs": runs}))
    if executed is not None:
        (tmp / "notebooks").mkdir(exist_ok=True)
        shutil.copy(executed, tmp / "notebooks" / executed.name)
    return tmp / "times.json"


def _executed_copy(src: Path, dest: Path) -> Path:
    """What papermill leaves: an injected-parameters cell, outputs, execution counts, metadata."""
    nb = json.loads(src.read_text(encoding="utf-8"))
    at = next(i for i, c in enumerate(nb["cells"]) if "parameters" in c.get("metadata", {}).get("tags", []))
    nb["cells"].insert(at + 1, {"cell_type": "code", "execution_count": 2, "id": "injected",
                                "metadata": {"tags": ["injected-parameters"]}, "outputs": [],
                                "source": ["# Parameters\n", "quick = True\n"]})
    for i, c in enumerate(nb["cells"]):
        if c["cell_type"] == "code":
            c["execution_count"] = i
            c["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["ran\n"]}]
            c["metadata"]["papermill"] = {"status": "completed"}
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(nb, indent=1))
    return dest


@pytest.fixture
def one_lesson(tmp_path):
    """A copy of notebook 00 in tmp/notebooks and data holding that lesson with no times."""
    folder = tmp_path / "notebooks"
    folder.mkdir()
    nb = Path(shutil.copy(ROOT / "notebooks" / f"{NB}.ipynb", folder))
    lesson = {k: v for k, v in _data()["lessons"][NB].items() if k != "times"}
    return nb, {"lessons": {NB: dict(lesson, times=[])}}


def _edit_source(nb: Path, cell_type: str = "markdown") -> None:
    data = json.loads(nb.read_text(encoding="utf-8"))
    cell = next(c for c in data["cells"] if c["cell_type"] == cell_type)
    cell["source"] = list(cell["source"]) + ["\n# one more line\n"]
    nb.write_text(json.dumps(data, indent=1))


def test_check_flags_a_notebook_edited_after_its_time_was_recorded(tmp_path, one_lesson):
    nb, data = one_lesson
    run = _run(tmp_path / "build", {NB: 12.3}, executed=_executed_copy(nb, tmp_path / "ex" / nb.name))
    said = ct.record(run, data, notebooks=nb.parent)
    entry = data["lessons"][NB]["times"][0]
    assert entry["notebook_sha256"] == ct.notebook_hash(nb), "the executed copy hashes as its source notebook"
    assert entry | {"notebook_sha256": None} == {"mode": "full", "kind": "cpu", "seconds": 12.3, "date": "2026-12-05",
                                                  "machine": "2-core Test CPU without bf16", "notebook_sha256": None}
    assert said == [f"{NB}: full 12 s on 2-core Test CPU without bf16"]
    assert ct.stale_report(data, ct.current_hashes(nb.parent)) == [], "the unchanged copy is not flagged"
    row = ct.course_map(data, ct.current_hashes(nb.parent)).splitlines()[2]
    assert "| 12 s (A) |" in row and ct.STALE not in row
    _edit_source(nb)
    stale = ct.stale_report(data, ct.current_hashes(nb.parent))
    assert len(stale) == 1 and stale[0].startswith(f"{NB} cpu full 12 s on 2-core Test CPU without bf16, 2026-12-05: "
                                                   "the notebook changed since")
    row = ct.course_map(data, ct.current_hashes(nb.parent)).splitlines()[2]
    assert f"| {ct.STALE} (2026-12): 12 s (A) |" in row


def test_outputs_and_metadata_do_not_make_a_time_stale(tmp_path, one_lesson):
    nb, _ = one_lesson
    before = ct.notebook_hash(nb)
    _executed_copy(nb, nb)  # outputs, execution counts, papermill metadata and its injected cell
    meta = json.loads(nb.read_text())
    meta["metadata"]["kernelspec"] = {"name": "another"}
    nb.write_text(json.dumps(meta))
    assert ct.notebook_hash(nb) == before
    _edit_source(nb, "code")
    assert ct.notebook_hash(nb) != before, "a changed code cell is a new version"


def test_check_fails_until_the_map_shows_an_edited_notebook_as_stale(tmp_path, one_lesson, monkeypatch, capsys):
    """The make-test behaviour: stale times are reported (exit 0) once README and the kit say so; a README still
    showing a stale time as current fails. --strict fails on any stale time."""
    nb, data = one_lesson
    ct.record(_run(tmp_path / "build", {NB: 12.3}), data, notebooks=nb.parent)
    times, readme = tmp_path / "course_times.json", tmp_path / "README.md"
    times.write_text(json.dumps(data))
    readme.write_text(f"# Course\n\n{ct.START}\n{ct.END}\n")
    for name, value in (("TIMES", times), ("README", readme), ("INSTRUCTORS", tmp_path / "instructors.md"),
                        ("NOTEBOOKS", nb.parent)):
        monkeypatch.setattr(ct, name, value)
    assert ct.main(["--check"]) == 1, "nothing generated yet"
    assert ct.main(["--write"]) == 0 and ct.main(["--check"]) == 0 and ct.main(["--check", "--strict"]) == 0
    _edit_source(nb)
    capsys.readouterr()
    assert ct.main(["--check"]) == 1, "README still shows the time as current"
    assert "out of date: README.md, instructors.md" in capsys.readouterr().out
    assert ct.main(["--write"]) == 0 and ct.main(["--check"]) == 0
    assert f"{ct.STALE} (2026-12): 12 s (A)" in readme.read_text()
    capsys.readouterr()
    assert ct.main(["--check", "--strict"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("course times: 1 of 1 recorded times measured an earlier version") and "changed since" in out


def test_readme_and_kit_are_generated_from_the_data_and_show_stale_times_as_stale():
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "course_times.py"), "--check"],
                          check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    data, hashes = _data(), ct.current_hashes()
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    kit = (ROOT / "docs" / "instructors.md").read_text(encoding="utf-8")
    for stem, lesson in data["lessons"].items():
        row = next(line for line in readme.splitlines() if line.startswith(f"| [`{stem}.ipynb`]"))
        for kind, mode, cell in zip(("cpu", "cpu", "gpu", "gpu"), ("full", "quick") * 2, row.split(" | ")[3:]):
            runs, current = ct.measured_set(lesson["times"], kind, mode, hashes[stem])
            assert (cell.startswith(ct.STALE) or not runs) if not current else ct.STALE not in cell, (stem, cell)
            figure = ct.figure(runs, current, ct.machine_tags(data))
            assert figure in cell, (stem, kind, mode)
            if kind == "cpu" and mode == "quick":
                assert re.search(rf"\| {stem} \| \d+ min \(\d+ \+ \d+ \+ \d+\) \| {re.escape(figure)} \|", kit), \
                    f"the agenda's {stem} row"


def test_migrated_times_are_all_flagged_as_an_unknown_version():
    """The times recorded before versions were kept (2026-11/12) must never pass as today's figures."""
    data = _data()
    old = [(s, t) for s, lesson in data["lessons"].items() for t in lesson["times"] if t.get("recorded_in_commit")]
    assert len(old) == 22 and all(t["notebook_sha256"] is None for _, t in old)
    report = ct.stale_report(data, ct.current_hashes())
    for stem, t in old:
        assert f"{stem} cpu {t['mode']} {ct.duration(t['seconds'])} on {t['machine']}, {t['date']}: its version was " \
               "not kept" in report


def _entry(seconds, machine, h="v1", mode="quick", kind="cpu", date="2026-12-05"):
    return {"mode": mode, "kind": kind, "seconds": seconds, "machine": machine, "date": date, "notebook_sha256": h}


def test_a_machine_that_changes_a_time_more_than_2x_is_named_with_both_figures():
    tags = {"fast AVX-512 BF16": "A", "slow AVX2": "B", "other": "C"}
    runs, current = ct.measured_set([_entry(22, "fast AVX-512 BF16"), _entry(281, "slow AVX2")], "cpu", "quick", "v1")
    assert ct.figure(runs, current, tags) == "22 s (A), 4.7 min (B): the machine changes it more than 2×"
    close = [_entry(30, "fast AVX-512 BF16"), _entry(50, "slow AVX2"), _entry(40, "slow AVX2")]
    assert ct.figure(close, True, tags) == "30–50 s (A, B; 3 runs)"
    assert ct.figure(close[:1] * 2, True, tags) == "30 s (A; 2 runs)"
    old_and_new = [_entry(22, "fast AVX-512 BF16", h="v0"), _entry(281, "slow AVX2")]
    runs, current = ct.measured_set(old_and_new, "cpu", "quick", "v1")
    assert ct.figure(runs, current, tags) == "4.7 min (B)", "a time of another version is no evidence about machines"


def test_the_agenda_margin_is_the_measured_spread_or_unknown():
    stem = "00_getting_started"
    lesson = {"question": "q", "gpu": "anywhere",
              "times": [_entry(30, "m1"), _entry(40, "m2"), _entry(90, "m2"), _entry(10, "m1", h="old")]}
    data = {"lessons": {stem: lesson}}
    you = {stem: {"total": 21, "reading": 12, "run": 1, "exercises": 8}}
    rows = ct.agenda(data, {stem: "v1"}, [stem], "quick", 9.0, learner=you)
    assert ct.spread(lesson["times"][:3]) == (40, 50)
    row = next(r for r in rows if f"| {stem} |" in r)
    assert "| 21 min (12 + 1 + 8) |" in row and "| +50 s (slowest of 3 runs on 2 machine(s)) | 25 min |" in row
    assert "the day would end 1 min later" in rows[-1]
    lesson["times"] = lesson["times"][:1]
    rows = ct.agenda(data, {stem: "v1"}, [stem], "quick", 9.0)
    assert "| unknown: one measurement |" in next(r for r in rows if f"| {stem} |" in r)
    assert "margin of lesson(s) 00 is unknown" in rows[-1] and "day would end" not in rows[-1]


def test_recording_a_gpu_run_fills_the_gpu_columns_and_skips_what_did_not_end(tmp_path, one_lesson):
    nb, data = one_lesson
    run = _run(tmp_path / "b", {NB: 4.2, "99_missing": 1.0, "05_x": 3.0}, gpu=True, quick=True,
               machine="1x NVIDIA H200", status={"05_x": "stopped"})
    said = ct.record(run, data, notebooks=nb.parent)
    assert data["lessons"][NB]["times"] == [{"mode": "quick", "kind": "gpu", "seconds": 4.2, "machine": "1x NVIDIA H200",
                                             "date": "2026-12-05", "notebook_sha256": ct.notebook_hash(nb)}]
    assert any(s.startswith("99_missing: not in data") for s in said)
    assert f"{NB}: no executed copy beside times.json; hashed {NB}.ipynb as it is now" in said
    assert "05_x: not recorded, it did not end normally (stopped)" in said
    assert f"{NB}: already recorded" in ct.record(run, data, notebooks=nb.parent)
    assert len(data["lessons"][NB]["times"]) == 1
    row = ct.course_map(data, ct.current_hashes(nb.parent)).splitlines()[2]
    assert row.endswith("| not yet measured | not yet measured | not yet measured | 4 s (A) |")


def test_make_test_runs_the_check():
    make = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^test: site-venv\n((?:\t.*\n)+)", make, re.MULTILINE).group(1)
    assert "$(PY) tools/course_times.py --check" in recipe and "--strict" not in recipe


def test_the_learners_time_counts_reading_the_quick_run_and_the_exercises(one_lesson):
    """Issue 38: reading at READ_WPM, the quick CPU run as measured (rounded up to a minute), EXERCISE_MIN per check
    and PREDICT_MIN per prediction; the title's line is made until its own words no longer change it, and does not
    change the notebook's version."""
    nb_path, data = one_lesson
    nb = json.loads(nb_path.read_text(encoding="utf-8"))
    lesson = data["lessons"][NB]
    already = ct.learner_time(nb, lesson, None)["exercises"]
    nb["cells"].append({"cell_type": "code", "execution_count": None, "id": "x", "metadata": {}, "outputs": [],
                        "source": ["check_prediction('00.p', guess)\n", "check('00.9', a)\n", "check('00.8', b)\n"]})
    lesson["times"] = [_entry(61, "m1", h=ct.notebook_hash(nb_path)), _entry(1000, "m1", mode="full")]
    made = ct.with_your_time(nb, lesson, "v-other")
    t = ct.learner_time(made, lesson, "v-other")
    assert (t["run"], t["exercises"]) == (2, already + 2 * ct.EXERCISE_MIN + ct.PREDICT_MIN) and not t["current"]
    assert t["reading"] == -(-ct._words(made)["total"] // ct.READ_WPM)
    line = next(ln for ln in "".join(made["cells"][0]["source"]).splitlines() if ln.startswith(ct.YOUR_TIME))
    assert line.startswith(f"{ct.YOUR_TIME} about {t['total']} min (reading {t['reading']}, run 2, exercises "
                           f"{t['exercises']}). The machine's run time, quick mode on a CPU: {ct.STALE} (2026-12): "
                           "61 s (m1); every mode")
    assert ct.with_your_time(made, lesson, "v-other") == made, "made twice, the same"
    assert "**Time:**" not in "".join(made["cells"][0]["source"]), "the old line is replaced"
    nb_path.write_text(json.dumps(nb))
    before = ct.notebook_hash(nb_path)
    nb_path.write_text(json.dumps(made))
    assert ct.notebook_hash(nb_path) == before, "the line the tool writes is not a new version of the lesson"
