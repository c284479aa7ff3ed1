"""A lesson opened where the learner's GPU is (Colab, Kaggle, any folder), proven offline on this machine.

tools/hosted_check.py builds the stand-in: a fresh Python with torch and the Jupyter kernel but not the course, a
wheel of this checkout, the notebook alone in an empty folder. `make hosted-check` runs every lesson that way.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import checkout_files

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
try:
    import course_links
    import hosted_check
finally:
    sys.path.remove(str(ROOT / "tools"))

LESSON = ROOT / "notebooks" / "03_transfer_overhead.ipynb"  # reads the vowels data, the datasheet and a solution
DEAD_PROXY = "http://127.0.0.1:9"  # no network: every connection is refused at once


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    return hosted_check.build_wheel(tmp_path_factory.mktemp("wheel"))


def test_first_cell_offline_without_course_source_fails_in_one_line(tmp_path):
    python = hosted_check.runtime_python(tmp_path)
    lesson = tmp_path / "lesson"
    lesson.mkdir()
    (lesson / "first_cell.py").write_text(course_links.first_cell())
    env = dict(hosted_check.runtime_env(tmp_path, None), GIT_TERMINAL_PROMPT="0",
               **{k: DEAD_PROXY for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")})
    done = subprocess.run([str(python), "first_cell.py"], cwd=lesson, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: could not install the course from git+https://"), done.stderr[-2000:]
    assert "COURSE_SOURCE" in last
    assert sorted(p.name for p in lesson.iterdir()) == ["first_cell.py"], "nothing left behind"


@pytest.mark.serial  # compares the whole checkout before and after: no other test may write into it meanwhile
def test_a_lesson_alone_in_an_empty_folder_installs_the_course_and_runs(wheel, tmp_path):
    python = hosted_check.runtime_python(tmp_path)
    before = checkout_files()
    r = hosted_check.run_lesson(python, LESSON, tmp_path / "lesson", hosted_check.runtime_env(tmp_path, str(wheel)))
    assert r["ok"], r["log"]
    assert r["installed"].startswith("Successfully installed gpu-training-course-"), r["installed"]
    assert r["kept"], f"the first cell must install no torch, torchvision or numpy: {r['installed']}"
    record = json.loads((tmp_path / "lesson" / "build" / "results" / f"{LESSON.stem}.json").read_text())
    assert record["quick"] is True and record["notebook"] == LESSON.stem
    after = checkout_files()
    changed = sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))
    assert changed == [], f"the hosted run wrote into the checkout: {changed[:10]}"
    # what the lesson read came from the installed package, which ships what lessons read and not the tools' data
    probe = ("import json; from helpers.results import course_file, in_checkout; "
             "names = [('data', 'gpu_datasheet.json'), ('data', 'JapaneseVowels_TRAIN.ts'), ('data', "
             "'tinyshakespeare.txt'), ('solutions', '03_transfer_overhead.py'), ('data', 'budget_floors.json')]; "
             "print(json.dumps([in_checkout()] + [[str(course_file(*n)), course_file(*n).is_file()] for n in names]))")
    out = subprocess.run([str(python), "-c", probe], cwd=tmp_path / "lesson", capture_output=True, text=True,
                         timeout=300, env=hosted_check.runtime_env(tmp_path, None))
    assert out.returncode == 0, out.stderr[-2000:]
    checkout, *files = json.loads(out.stdout)
    assert checkout is False
    assert all(path.startswith(str(tmp_path / "python")) for path, _ in files), "read from the installed package"
    assert [found for _, found in files] == [True, True, True, True, False]


def _by_hand(name: str, text: str | None = None) -> str:
    """A tracked file's text without what tools/course_links.py makes (and course_times.py's course map)."""
    text = (ROOT / name).read_text(encoding="utf-8", errors="replace") if text is None else text
    if name == "README.md":
        start, end = text.index("<!-- course-map: generated"), text.index("<!-- course-map end -->")
        return text[:start] + text[end:]
    if name.startswith("notebooks/") and name.endswith(".ipynb"):
        cells = json.loads(text)["cells"]
        kept = [c for c in cells if c.get("id") != course_links.CELL_ID]
        title = "".join(kept[0]["source"]).split("\n")
        return "\n".join(line for line in title if not line.startswith(course_links.LINKS)) + json.dumps(kept[1:])
    return text


def test_course_address_is_written_only_in_pyproject_and_what_is_made_from_it():
    url = course_links.source_url()
    assert url.startswith("https://github.com/")
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        nb = json.loads(path.read_text(encoding="utf-8"))
        assert course_links.made(nb, path.stem) == nb, f"{path.name}: run python tools/course_times.py --write"
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    slug = url.removeprefix("https://github.com/")
    written = [name for name in tracked if name != "pyproject.toml" and (ROOT / name).is_file()
               and slug in _by_hand(name)]
    assert written == [], f"the course's address is written by hand in {written}: read it from pyproject.toml"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for stem in ("00_getting_started", "11_small_gpt"):
        assert all(link in readme for link in course_links.open_links(stem).values())


def test_the_address_check_can_fail():
    name = "notebooks/03_transfer_overhead.ipynb"
    nb = json.loads((ROOT / name).read_text(encoding="utf-8"))
    slug = course_links.source_url().removeprefix("https://github.com/")
    assert slug not in _by_hand(name, json.dumps(nb))
    nb["cells"][5]["source"].append(f"see https://github.com/{slug}/issues")
    assert slug in _by_hand(name, json.dumps(nb))
