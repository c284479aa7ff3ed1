"""The executed course in a real browser: every page of `make site`, and one notebook run in JupyterLab's UI.

Both drive Debian's Chromium (/usr/bin/chromium) with Playwright's Python package, which never downloads a
browser of its own. They run after nbval (the `browser` marker: conftest.py orders them last) and build the site
from the notebooks nbval just executed (build/test-executed/). Without Chromium they skip with one line on a
learner's machine; `.ci/run` sets COURSE_REQUIRE_BROWSER=1, and there a missing browser is a failure.
"""
from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from urllib.parse import urljoin, urlparse

import nbformat
import pytest
from conftest import executed_notebooks
import torch

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-sync",
                 "--disable-background-networking", "--disable-component-update"]
pytestmark = pytest.mark.browser


def _missing(reason: str):
    if os.environ.get("COURSE_REQUIRE_BROWSER") == "1":
        pytest.fail(f"{reason} (COURSE_REQUIRE_BROWSER=1: CI must run the browser tests)")
    pytest.skip(f"{reason}: install Debian's chromium and `pip install -e .[site]` to run the browser tests")


@pytest.fixture(scope="module")
def browser():
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        _missing("no Chromium on this machine")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("the playwright package is not installed")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        yield b
        b.close()


class Page:
    """A browser page that records console errors and refuses (and records) every request off this machine."""

    def __init__(self, browser, offline: bool = True, **context):
        context.setdefault("viewport", {"width": 1280, "height": 900})
        self.context = browser.new_context(**context)
        self.page = self.context.new_page()
        self.errors, self.external = [], []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        if offline:
            self.page.route("**/*", self._route)

    def _route(self, route):
        host = urlparse(route.request.url).hostname
        if host in ("127.0.0.1", "localhost") or route.request.url.startswith("data:"):
            route.continue_()
        else:
            self.external.append(route.request.url)
            route.abort()

    def close(self):
        self.context.close()


def _serve(folder: Path):
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    executed, results = executed_notebooks()
    out = tmp_path_factory.mktemp("site") / "site"
    started = time.perf_counter()
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "build_site.py"), "--notebooks", str(executed),
                           "--results", str(results), "--out", str(out), "--no-run"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr + done.stdout
    print(f"site built in {time.perf_counter() - started:.0f} s")
    server, url = _serve(out)
    yield out, url, executed
    server.shutdown()


def _makes_figures(nb_path: Path) -> bool:
    nb = nbformat.read(nb_path, as_version=4)
    return any("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)


def _title(nb_path: Path) -> str:
    nb = nbformat.read(nb_path, as_version=4)
    first = next(c for c in nb.cells if c.cell_type == "markdown")
    title = next(line for line in first.source.splitlines() if line.startswith("# "))[2:].strip()
    return title.replace("`", "").replace("*", "")  # as the page shows it: Markdown's code and emphasis marks gone


def _check_links(page: Page, url: str) -> list[str]:
    """Every link to a page of this site answers 200 (anchors ignored)."""
    hrefs = page.page.eval_on_selector_all("a[href]", "els => els.map(e => e.getAttribute('href'))")
    broken = []
    for href in sorted(set(hrefs)):
        target = urljoin(url, href).split("#")[0]
        if not target.startswith(url.split("/")[0] + "//" + urlparse(url).netloc):
            continue
        if page.context.request.get(target).status != 200:
            broken.append(href)
    return broken


def test_every_site_page_in_chromium(browser, site):
    out, base, executed = site
    lessons = sorted(executed.glob("[0-9][0-9]_*.ipynb"))
    pages = [("index.html", None), ("instructors.html", None)] + [(nb.stem + ".html", nb) for nb in lessons]
    page = Page(browser)
    for name, nb in pages:
        url = base + name
        assert page.page.goto(url).status == 200, name
        heading = page.page.inner_text("main h1") if page.page.query_selector("main h1") else ""
        assert heading.strip(), f"{name} shows no title"
        assert _check_links(page, url) == [], f"{name} has links that do not resolve"
        if nb is None:
            continue
        assert _title(nb) in heading, f"{name}: title {heading!r} is not the notebook's {_title(nb)!r}"
        text = page.page.inner_text("main")
        assert "Outputs on this page: measured on" in text, f"{name} names no hardware"
        assert "# NBVAL_" not in text, f"{name} shows the test suite's markers in its code"
        assert not re.search(r"(?<![\w.])/(work|tmp|root|home)/", text), f"{name} names a folder of the builder"
        if _makes_figures(nb):
            shown = page.page.eval_on_selector_all("main img", "els => els.filter(e => e.naturalWidth > 0).length")
            assert shown >= 1, f"{name}: the notebook draws figures but none rendered"
        assert "solutions/" not in page.page.inner_text("main") or "solution is not shown" in \
            page.page.inner_text("main"), name
    assert page.errors == [], f"console errors: {page.errors}"
    assert page.external == [], f"pages asked for resources off this machine: {page.external}"
    page.close()


def test_site_pages_read_without_javascript(browser, site):
    """The lessons' text and figures are in the HTML itself, not put there by scripts."""
    out, base, executed = site
    page = Page(browser, java_script_enabled=False)
    for nb in sorted(executed.glob("[0-9][0-9]_*.ipynb")):
        page.page.goto(base + nb.stem + ".html")
        main = page.page.inner_text("main")
        assert _title(nb) in main and "Outputs on this page" in main, nb.stem
        if _makes_figures(nb):
            assert page.page.eval_on_selector_all("main img", "els => els.length") >= 1, nb.stem
    page.close()


def test_solutions_are_hidden_on_the_site(browser, site):
    """No exercise's solution appears on its lesson's page; a pointer to the solutions file does."""
    from helpers.course import solution_sections

    out, base, executed = site
    page = Page(browser)
    for path in sorted((ROOT / "solutions").glob("[0-9][0-9]_*.py")):
        page.page.goto(base + path.stem + ".html")
        text = page.page.inner_text("main")
        assert "The solution is not shown on this site" in text, path.stem
        for number, code in solution_sections(path.stem).items():
            longest = max(code.splitlines(), key=len).strip()
            assert longest not in text, f"{path.stem}: solution {number} leaked ({longest!r})"
    page.close()


# ---------------------------------------------------------------- what a reader sees on each page

LAPTOP = {"width": 1366, "height": 768}  # the most common laptop screen
SCREENSHOTS = ROOT / "build" / "site-screenshots"
# The lesson column holds 128 characters of code at LAPTOP width (120 at 1280 px): notebook code lines are kept to
# 120 (`ruff check --select E501 --line-length 120 notebooks/`), and long printed prose wraps (tools/build_site.py).
# The blocks allowed to scroll sideways, by page: {the longest line's first 40 characters (stripped): reason}.
# An exception that no longer scrolls fails the test too: remove it.
PROFILER_TABLE = "PyTorch's profiler table: {} columns, about {} characters wide; wrapping would break its columns"
SCROLLING_ALLOWED: dict[str, dict[str, str]] = {
    "09_profiler_and_memory": {"------------------------------  --------": PROFILER_TABLE.format(9, 160)},
}
if torch.cuda.is_available():  # a site built on CUDA: 03's table gains the CUDA columns (116 characters on a CPU)
    SCROLLING_ALLOWED["03_transfer_overhead"] = {"------------------------------  --------": (
        "PyTorch's profiler table with its CUDA columns: wider than 128 characters; wrapping would break them")}
WIDE_BLOCKS = """els => els.filter(e => e.scrollWidth > e.clientWidth + 1).map(e => ({
    kind: e.closest('.cell_output, .output') ? 'output' : 'code',
    line: e.innerText.split('\\n').reduce((a, b) => (b.length > a.length ? b : a), ''),
    hidden_px: e.scrollWidth - e.clientWidth}))"""


MARKDOWN_TABLE = re.compile(r"\|\s*[-—–:]+\s*\||\|\s*\|\s*\|")  # "|---|" (or its dashes typeset), "| | |"


BROWSER_WRAPPED = """els => els.map(e => {
    const range = document.createRange(); range.selectNodeContents(e);
    const tops = new Set([...range.getClientRects()].filter(r => r.width > 0).map(r => Math.round(r.top)));
    const lines = e.innerText.replace(/\\n+$/, '').split('\\n').filter(l => l.trim()).length;
    return {rendered: tops.size, lines: lines, first: e.innerText.slice(0, 60)};
}).filter(b => b.rendered > b.lines)"""


def browser_wrapped_outputs(page) -> list[dict]:
    """Printed outputs of which the browser broke a line (where it splits "overhead-bound" after its hyphen): the
    site breaks its own long lines of prose, so at a laptop's width the browser should break none."""
    return page.eval_on_selector_all(".tag_output-wraps .cell_output .output.stream pre, "
                                     ".tag_output-wraps .cell_output .output.stderr pre", BROWSER_WRAPPED)


def scrolling_blocks(page) -> list[dict]:
    """The code blocks and printed outputs on the page that need a horizontal scroll bar to be read."""
    return page.eval_on_selector_all("main pre", WIDE_BLOCKS)


def test_no_code_block_scrolls_sideways_on_a_laptop(browser, site):
    """At 1366 px, every lesson's code and printed output is read without scrolling sideways. With
    COURSE_SCREENSHOTS=1 a full-page screenshot of every page goes to build/site-screenshots/ to look at (two
    seconds a page: not in every test run)."""
    out, base, executed = site
    shots = os.environ.get("COURSE_SCREENSHOTS") == "1"
    if shots:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page, found, stale, counts = Page(browser, viewport=LAPTOP), {}, {}, {}
    for name in ["index", "instructors"] + [nb.stem for nb in sorted(executed.glob("[0-9][0-9]_*.ipynb"))]:
        page.page.goto(base + name + ".html")
        if shots:
            page.page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)
        blocks, allowed = scrolling_blocks(page.page), SCROLLING_ALLOWED.get(name, {})
        counts[name] = len(blocks)
        wide = [b for b in blocks if b["line"].strip()[:40] not in allowed]
        if wide:
            found[name] = [f"{b['kind']} hides {b['hidden_px']} px: {b['line'].strip()[:90]!r}" for b in wide]
        for b in browser_wrapped_outputs(page.page):
            found.setdefault(name, []).append(f"output broken by the browser into {b['rendered']} lines where it "
                                              f"prints {b['lines']}: {b['first']!r}")
        gone = set(allowed) - {b["line"].strip()[:40] for b in blocks}
        if gone:
            stale[name] = sorted(gone)
    page.close()
    print(f"blocks scrolling sideways at {LAPTOP['width']} px, by page: {counts}")
    assert found == {}, "code blocks that scroll sideways at 1366 px:\n" + json.dumps(found, indent=1)
    assert stale == {}, f"SCROLLING_ALLOWED names blocks that no longer scroll (remove them): {stale}"


def test_the_scroll_check_can_fail(browser):
    page = Page(browser, viewport=LAPTOP)
    page.page.set_content("<main><pre style='overflow-x:auto;width:300px'>" + "x" * 200 + "</pre>"
                          "<pre style='overflow-x:auto;width:300px'>short</pre></main>")
    assert [b["kind"] for b in scrolling_blocks(page.page)] == ["code"]
    page.page.set_content("<main><div class='tag_output-wraps'><div class='cell_output'><div class='output stream'>"
                          "<pre style='white-space:pre-wrap;width:300px'>" + "overhead-bound " * 40 + "\nshort"
                          "</pre></div></div></div></main>")
    assert [b["lines"] for b in browser_wrapped_outputs(page.page)] == [2]
    page.close()


def test_hardware_is_a_table_on_every_lesson_page(browser, site):
    """"Your hardware" reaches the page as an HTML table, and no page shows Markdown table syntax as text."""
    out, base, executed = site
    page = Page(browser)
    for nb in sorted(executed.glob("[0-9][0-9]_*.ipynb")):
        page.page.goto(base + nb.stem + ".html")
        cells = page.page.eval_on_selector_all("main table td", "els => els.map(e => e.innerText.trim())")
        assert {"CPU", "PyTorch"} <= set(cells), f"{nb.stem}: no hardware table (table cells: {cells[:6]})"
        text = page.page.inner_text("main")
        assert not MARKDOWN_TABLE.search(text), f"{nb.stem}: Markdown table syntax as text"
    page.close()


# ---------------------------------------------------------------- JupyterLab, where learners run the course

JUPYTER_NOTEBOOK = "00_getting_started.ipynb"  # the first lesson a learner opens (01 took 15 s more)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def jupyterlab(tmp_path):
    work = tmp_path / "lab"
    work.mkdir()
    shutil.copy(ROOT / "notebooks" / JUPYTER_NOTEBOOK, work / JUPYTER_NOTEBOOK)
    port, token = _free_port(), "course-test"
    env = dict(os.environ, COURSE_QUICK="1", COURSE_DEVICE="cpu", COURSE_RESULTS_DIR=str(tmp_path / "results"),
               JUPYTER_CONFIG_DIR=str(tmp_path / "cfg"), JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"))
    env.pop("COURSE_RUN_SOLUTIONS", None)  # as a learner has it: solutions are shown, not run
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
           f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={work}", "--allow-root"]
    server = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    for _ in range(120):
        try:
            urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
            break
        except OSError:
            assert server.poll() is None, f"jupyter lab exited: {server.stderr.read()[-2000:]}"
            time.sleep(0.5)
    yield base, token, work / JUPYTER_NOTEBOOK
    server.terminate()
    server.wait(timeout=30)


def _kernel_idle_for(page, seconds: float, timeout: float) -> bool:
    """True once the notebook's execution indicator has shown idle for ``seconds`` in a row (Run All queues cells)."""
    deadline, since = time.time() + timeout, None
    while time.time() < deadline:
        idle = page.query_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']") is not None
        since = (since or time.time()) if idle else None
        if since and time.time() - since >= seconds:
            return True
        time.sleep(0.5)
    return False


def test_a_notebook_runs_in_jupyterlab_through_the_ui(browser, jupyterlab, tmp_path):
    base, token, path = jupyterlab
    page = Page(browser, offline=False)  # JupyterLab is a local app: nothing to refuse, and its saves pass untouched
    page.page.goto(f"{base}/lab/tree/{path.name}?token={token}")
    page.page.wait_for_selector(".jp-Notebook .jp-CodeCell", timeout=120_000)
    assert _kernel_idle_for(page.page, 2, 120), "the kernel never started"
    page.page.click(".lm-MenuBar-item:has-text('Run')")
    page.page.get_by_text("Run All Cells", exact=True).click()  # the menu, as a learner does
    page.page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='busy']", timeout=60_000)
    finished = _kernel_idle_for(page.page, 5, 600)
    page.page.screenshot(path=str(tmp_path / "jupyterlab.png"))  # kept with the test's tmp folder if it fails
    assert finished, f"the notebook was still running after 10 minutes (screenshot: {tmp_path / 'jupyterlab.png'})"
    page.page.click(".lm-MenuBar-item:has-text('File')")
    page.page.get_by_text("Save Notebook", exact=True).click()  # File ▸ Save Notebook (Ctrl+S)
    nb = {}
    for _ in range(60):  # the save lands when every code cell in the file has its execution count
        nb = json.loads(path.read_text(encoding="utf-8"))
        if all(c["execution_count"] for c in nb["cells"] if c["cell_type"] == "code"):
            break
        time.sleep(0.5)
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    errors = [o for c in code for o in c["outputs"] if o["output_type"] == "error"]
    assert errors == [], f"cells raised in JupyterLab: {[e['ename'] + ': ' + e['evalue'] for e in errors]}"
    unrun = [i for i, c in enumerate(code) if not c["execution_count"]]
    assert code and not unrun, f"code cells {unrun} never ran (saved notebook); screenshot: {tmp_path / 'jupyterlab.png'}"
    page.close()


def _build_site():
    """tools/build_site.py as a module (its functions, without building a site)."""
    from conftest import import_tool

    return import_tool("build_site")


def test_long_printed_prose_is_broken_where_a_reader_expects():
    """The site breaks long printed lines itself (tools/build_site.py): at spaces, never after a hyphen, never
    between a number and its unit or a label and its number, continuation lines indented."""
    build_site = _build_site()
    line = ("  H100 SXM, true fp32 (TF32 off), predicted from the datasheet, not measured: batch 8: 11.27 ms "
            "(overhead-bound), batch 64: 14.64 ms (overhead-bound), batch 512: 14.08 ms (memory-bound), "
            "measured / predicted 2.05, a per-kernel floor of 4.2 µs")
    out = build_site.wrap_line(line, 60).split("\n")
    assert len(out) > 2 and all(len(x) <= 60 for x in out), out
    assert " ".join(x.strip() for x in out) == line.strip()  # nothing lost, nothing added
    assert all(x.startswith("    ") for x in out[1:]) and out[0].startswith("  H100")
    for broken in out[:-1]:
        assert not broken.endswith(("-", ":", "14.64", "11.27", "14.08", "predicted", "4.2")), out
    assert build_site.wrap_line("short line", 60) == "short line"
    chained = build_site.wrap_line("batch 8 with 4 workers and 2 threads on 3 cores, " * 4, 30).split("\n")
    assert all(len(x) <= 30 for x in chained), chained  # glued pieces never chain into one wider than a line


def test_the_site_drops_the_test_suites_markers_from_code():
    build_site = _build_site()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("# NBVAL_IGNORE_OUTPUT\nx = 1  # NBVAL_ stays\n"),
                                         nbformat.v4.new_code_cell("# NBVAL_CHECK_OUTPUT\nprint(2)"),
                                         nbformat.v4.new_markdown_cell("# NBVAL_IGNORE_OUTPUT in prose stays")])
    build_site.strip_test_markers(nb)
    assert [c.source for c in nb.cells] == ["x = 1  # NBVAL_ stays\n", "print(2)",
                                            "# NBVAL_IGNORE_OUTPUT in prose stays"]


def test_the_site_leaves_out_the_run_budget_cells(tmp_path):
    """Issue 38: the cells that size a lesson to make gpu-check's budget are not part of the page."""
    build_site = _build_site()
    nb = nbformat.read(ROOT / "notebooks" / "04_cpu_and_gpu_roles.ipynb", as_version=4)
    hidden = nbformat.v4.new_code_cell("rounds = 1 if lesson.budget_s else 3", metadata={"tags": ["run-budget"]})
    nb.cells.insert(5, hidden)
    nbformat.write(nb, tmp_path / "04_cpu_and_gpu_roles.ipynb")
    page = tmp_path / "page.ipynb"
    build_site.lesson_page(tmp_path / "04_cpu_and_gpu_roles.ipynb", tmp_path / "results", page)
    sources = [c.source for c in nbformat.read(page, as_version=4).cells]
    budget = [c.source for c in nb.cells if "run-budget" in c.metadata.get("tags", [])]
    assert len(budget) > 1 and len(sources) == len(nb.cells) - len(budget) and not set(budget) & set(sources)


def test_an_executed_copy_is_stale_only_when_its_cells_differ(tmp_path):
    """One rule of staleness for the site and the course map (course_times.notebook_hash): an executed copy with
    outputs, papermill's metadata and its injected parameters is current; an edited cell makes it stale; a
    missing copy is stale. File times do not count (a fresh clone gives every file a new one)."""
    import nbformat

    build_site = _build_site()
    source = ROOT / "notebooks" / "00_getting_started.ipynb"
    nb = nbformat.read(source, as_version=4)
    nb.metadata["papermill"] = {"parameters": {"quick": True}}
    nb.cells.insert(3, nbformat.v4.new_code_cell("quick = True", metadata={"tags": ["injected-parameters"]}))
    nb.cells[4].outputs = [nbformat.v4.new_output("stream", text="measured\n")]
    nbformat.write(nb, tmp_path / source.name)
    stale = lambda: "00" in build_site.stale(tmp_path)  # noqa: E731
    assert not stale()
    nb.cells[-1].source += "\n# edited"
    nbformat.write(nb, tmp_path / source.name)
    assert stale()
    (tmp_path / source.name).unlink()
    assert stale()
