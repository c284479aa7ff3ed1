"""Build the executed course as a static website into build/site/ (`make site`).

Executed notebooks come from `make run` (build/notebooks/): a notebook whose executed copy is missing or made from
other cells than its source has now is run first with tools/run_course.py (full mode; --quick for quick mode), unless --no-run.
Each lesson page opens with a line naming the hardware, torch version, mode and date its outputs came from
(from the notebook's results file), and the exercises' solutions are not shown. The generator is Sphinx with
MyST-NB and the Sphinx Book Theme, all from the `site` extra: they build offline (no theme or template is fetched
at build time) and the pages need no network (no web fonts, no CDN scripts: the notebooks have no LaTeX).
The site is built into a temporary folder and renamed into place, so a failed build leaves the old one intact.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat

from course_times import notebook_hash  # (tools/ is the script's folder: first on sys.path)
from helpers.text import wrap

ROOT = Path(__file__).resolve().parent.parent
SOLUTION_CALL = re.compile(r"^\s*solution\(", re.M)
CONF = '''\
project = "GPU training performance in PyTorch"
author = "the course's authors"
extensions = ["myst_nb"]
nb_execution_mode = "off"          # the notebooks arrive executed (make run / the test run)
nb_merge_streams = True
myst_heading_anchors = 3
suppress_warnings = ["myst.header", "mystnb.unknown_mime_type", "misc.highlighting_failure"]
exclude_patterns = ["_build"]
html_theme = "sphinx_book_theme"
html_title = project
html_static_path = ["_static"]
html_css_files = ["course.css"]
html_theme_options = {
    "show_navbar_depth": 1,
    "use_download_button": False,
    "use_fullscreen_button": False,
    "show_prev_next": True,
    "home_page_in_toc": True,
    "secondary_sidebar_items": [],  # the lesson takes that column: its contents go under the navigation instead
}
html_sidebars = {"**": ["navbar-logo.html", "icon-links.html", "search-button-field.html", "sbt-sidebar-nav.html",
                        "page-toc.html"]}
html_context = {"default_mode": "light"}  # an empty mode makes the theme log a console error
nb_ipywidgets_js = {}                        # no widget scripts from a CDN: progress bars show as text
nb_render_markdown_format = "gfm"            # Markdown outputs as JupyterLab shows them (GitHub's, with tables)
'''


CSS = Path(__file__).with_name("site.css")  # the lesson column's width, code at 13 px, no right-hand panel
TABLE_ROW = re.compile(r"^[\s|+]*[-=─━]{10,}[-=─━\s|+]*$|\S {2,}\S.*\S {2,}\S")  # a rule, or 3+ columns
WRAP_LIMIT = 120  # characters of a printed line that fit the lesson column at 1366 px

ONLY: set[str] = set()  # --only: these notebook prefixes (a partial site, for a quick look)


def source_notebooks() -> list[Path]:
    found = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    return [nb for nb in found if not ONLY or nb.name[:2] in ONLY]


def stale(executed_dir: Path) -> list[str]:
    """Notebook prefixes whose executed copy is missing or was made from other cells than the source has now (the
    one rule of staleness, ``course_times.notebook_hash``: outputs and metadata do not count)."""
    return [nb.name[:2] for nb in source_notebooks() if not (executed_dir / nb.name).exists()
            or notebook_hash(executed_dir / nb.name) != notebook_hash(nb)]


def provenance(results_dir: Path, stem: str, nb) -> str:
    """The line naming where this page's outputs came from (hardware, torch, mode, date)."""
    path = results_dir / f"{stem}.json"
    if not path.exists():
        when = (nb.metadata.get("papermill", {}).get("end_time") or "an unrecorded date")[:10]
        return f"Outputs on this page: hardware not recorded (no `{path.name}` results file); run of {when}."
    rec = json.loads(path.read_text(encoding="utf-8"))
    hw = rec["hardware"]
    gpus = ", ".join(g["name"] for g in hw.get("gpus", [])) or "no GPU"
    mode = "quick mode" if rec["quick"] else "full mode"
    return (f"Outputs on this page: measured on {hw.get('cpu')} ({hw.get('cpu_cores')} cores) with {gpus}, "
            f"device `{rec['device']}`, torch {hw.get('torch')}, {mode}, {rec['timestamp'][:10]}.")


def hide_solutions(nb, stem: str) -> None:
    """Replace the output of every solution cell with a pointer to the solution file."""
    for cell in nb.cells:
        if cell.cell_type == "code" and SOLUTION_CALL.search(cell.source):
            cell.outputs = [nbformat.v4.new_output("display_data", data={
                "text/markdown": f"*The solution is not shown on this site: try the exercise first. It is in "
                                 f"`solutions/{stem}.py`, and the notebook shows it when you run this cell.*",
                "text/plain": "(solution hidden)"})]


WIDGET = "application/vnd.jupyter.widget-view+json"


def wide_table(text: str) -> bool:
    """Whether ``text`` prints a table (a rule line, or rows of 3+ columns) with rows too wide for the column."""
    return any(len(line) > WRAP_LIMIT and TABLE_ROW.search(line.strip()) for line in text.splitlines())


def wrap_line(line: str, width: int = WRAP_LIMIT) -> str:
    """A long printed line of prose broken where a reader expects it (``helpers.text.wrap``: at spaces, never
    after a hyphen, between a number and its unit or a word and its number, all of which a browser's wrapping
    splits), continuation lines indented two more than the first."""
    if len(line) <= width:
        return line
    indent = line[:len(line) - len(line.lstrip())]
    return wrap(line.strip(), width, indent=indent, hang=indent + "  ")


def wrap_prose_outputs(nb) -> None:
    """Break the long printed lines of prose at ``WRAP_LIMIT`` characters (``wrap_line``), so the page shows
    them whole at a laptop's width; lines that fit are untouched, so a narrow table stays aligned. A cell printing
    a table too wide to fit keeps its lines whole: aligned, and scrolling. Tagged cells also wrap in the browser,
    for windows narrower than a laptop's."""
    for cell in nb.cells:
        if cell.cell_type != "code" or not cell.outputs:
            continue
        texts = ["".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", "")) for o in cell.outputs]
        if any(wide_table(t) for t in texts):
            continue
        cell.metadata.setdefault("tags", []).append("output-wraps")
        for out in cell.outputs:
            if out.get("output_type") == "stream":
                out["text"] = "\n".join(wrap_line(x) for x in "".join(out["text"]).split("\n"))


TEST_MARKER = re.compile(r"^# NBVAL_[A-Z_]+[ \t]*\n?", re.M)


def strip_test_markers(nb) -> None:
    """Drop the ``# NBVAL_IGNORE_OUTPUT`` / ``# NBVAL_CHECK_OUTPUT`` lines: they tell the test suite (nbval) how
    to compare a cell's output, and only clutter the page's code."""
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.source = TEST_MARKER.sub("", cell.source)


def drop_widgets(nb) -> None:
    """Live widgets (progress bars) cannot render on a static page: keep their text, drop their view."""
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for out in cell.outputs:
            out.get("data", {}).pop(WIDGET, None)
        cell.outputs = [o for o in cell.outputs if o.get("output_type") not in ("display_data", "execute_result")
                        or o.get("data")]


def lesson_page(executed: Path, results_dir: Path, dest: Path) -> str:
    """Write the page's notebook (solutions hidden, widgets as text, links and hardware line); returns that line."""
    nb = nbformat.read(executed, as_version=4)
    nb.cells = [c for c in nb.cells if not {"injected-parameters", "run-budget"} & set(c.metadata.get("tags", []))]
    stem = executed.stem
    hide_solutions(nb, stem)
    strip_test_markers(nb)
    drop_widgets(nb)
    wrap_prose_outputs(nb)
    lessons = {p.name for p in source_notebooks()}
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = _relink(cell.source, lessons)
    title = next(c for c in nb.cells if c.cell_type == "markdown")  # its first line is the lesson's "# " title
    head, _, rest = title.source.partition("\n")
    line = provenance(results_dir, stem, nb)
    title.source = f"{head}\n\n> {line}\n{rest}"
    for cell in nb.cells:
        cell.pop("id", None)
    nb.nbformat_minor = 4  # ids dropped: the copy is written as nbformat 4.4
    nbformat.write(nb, dest)
    return line


def _relink(markdown: str, lessons: set[str]) -> str:
    """Repository links → site links: lessons, the README (the home page) and the instructors' page resolve;
    other repository files become code, since the site does not carry them."""
    def fix(m):
        text, target = m.group(1), m.group(2)
        if target.startswith(("http://", "https://", "#")):
            return m.group(0)
        path, _, anchor = target.partition("#")
        name = path.removeprefix("../").removeprefix("notebooks/").removeprefix("docs/")
        name = {"README.md": "index.md"}.get(name, name)
        if name in lessons or name in ("instructors.md", "index.md"):
            return f"[{text}]({name}{'#' + anchor if anchor else ''})"
        return f"{text} (`{target}` in the repository)"
    return re.sub(r"\[([^\]]+)\]\(([^)\s]+)\)", fix, markdown)


def home_page(lessons: list[str], lines: list[str]) -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    body = _relink(readme, set(lessons))
    toc = "\n".join(["", "```{toctree}", ":maxdepth: 1", ":caption: Lessons", "", *lessons, "```", "",
                     "```{toctree}", ":maxdepth: 1", ":caption: Teaching it", "", "instructors.md", "```", ""])
    where = "\n".join(f"- `{name}`: {line.removeprefix('Outputs on this page: ')}" for name, line in lines)
    return body + "\n## Where this site's outputs come from\n\n" + where + "\n" + toc


def write_sources(src: Path, executed_dir: Path, results_dir: Path) -> list[str]:
    lessons, lines = [], []
    for nb in source_notebooks():
        executed = executed_dir / nb.name
        if not executed.exists():
            raise SystemExit(f"error: {executed} is missing: run `make run` (or `make site`, which runs it) first")
        lessons.append(nb.name)
        lines.append((nb.stem, lesson_page(executed, results_dir, src / nb.name)))
    instructors = ROOT / "docs" / "instructors.md"
    text = instructors.read_text(encoding="utf-8") if instructors.exists() else "# Instructors\n\nNot written yet.\n"
    (src / "instructors.md").write_text(_relink(text, set(lessons)), encoding="utf-8")
    (src / "index.md").write_text(home_page(lessons, lines), encoding="utf-8")
    (src / "conf.py").write_text(CONF, encoding="utf-8")
    (src / "_static").mkdir(exist_ok=True)
    shutil.copyfile(CSS, src / "_static" / "course.css")
    return lessons


def build(executed_dir: Path, results_dir: Path, out: Path) -> Path:
    work = out.parent / (out.name + ".building")
    shutil.rmtree(work, ignore_errors=True)
    src = work / "src"
    src.mkdir(parents=True)
    write_sources(src, executed_dir, results_dir)
    html = work / "html"
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-q", "-E", str(src), str(html)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"error: sphinx-build failed (sources kept in {src}):\n{done.stderr[-3000:]}")
    old = out.parent / (out.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        out.rename(old)
    html.rename(out)
    shutil.rmtree(old, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--notebooks", default=str(ROOT / "build" / "notebooks"), help="executed notebooks")
    ap.add_argument("--results", default=None, help="their results files (default: ../results beside them)")
    ap.add_argument("--out", default=str(ROOT / "build" / "site"))
    ap.add_argument("--quick", action="store_true", help="run stale notebooks in quick mode")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--only", default="", help="comma-separated notebook prefixes (default: all)")
    ap.add_argument("--no-run", action="store_true", help="never run notebooks; fail if an executed copy is missing")
    args = ap.parse_args(argv)
    ONLY.update(p.strip() for p in args.only.split(",") if p.strip())
    executed = Path(args.notebooks).resolve()
    results = Path(args.results).resolve() if args.results else executed.parent / "results"
    todo = stale(executed)
    if todo and not args.no_run:
        print(f"Running {', '.join(todo)} first (their executed copies are missing or made from other cells)")
        cmd = [sys.executable, str(ROOT / "tools" / "run_course.py"), "--only", ",".join(todo), "--device",
               args.device, "--out", str(executed.parent)] + (["--quick"] if args.quick else [])
        rc = subprocess.run(cmd).returncode
        if rc:
            return rc
    started = dt.datetime.now()
    site = build(executed, results, Path(args.out).resolve())
    print(f"Site built in {(dt.datetime.now() - started).total_seconds():.0f} s: {site / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
