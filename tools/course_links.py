"""The course's address, written once (pyproject.toml's [project.urls] Source), and what is made from it: each lesson's
first code cell (it installs the course where it is missing: Colab, Kaggle, any folder), the "Open in Colab" and
"Open in Kaggle" links of each lesson's title cell, and those of the README's course map. tools/course_times.py
--write writes them into the lessons and the README, and its --check fails when they disagree.
"""
from __future__ import annotations

import json
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BRANCH = "main"
CELL_ID = "anywhere"  # the first code cell's id
LINKS = "**Open on a free GPU:** "  # how the title cell's line of links starts
FIRST_CELL = """\
# Runs anywhere. In a copy of the course this does nothing; elsewhere (Colab, Kaggle, a bare folder) it installs
# the course once, from $COURSE_SOURCE if set, and keeps the runtime's own torch, torchvision and numpy.
import importlib, importlib.metadata as md, os, subprocess, sys  # noqa: E401
if os.path.isfile("../helpers/course.py"):  # this notebook sits in a checkout's notebooks/ folder
    sys.path.insert(0, os.path.abspath(".."))
else:
    try:
        md.version("gpu-training-course")
    except md.PackageNotFoundError:
        source = os.environ.get("COURSE_SOURCE") or "git+{source}"
        keep = [f"{{name}}=={{md.version(name).split('+')[0]}}" for name in ("torch", "torchvision", "numpy")]
        pip = subprocess.run([sys.executable, "-m", "pip", "install", "--no-input", source, *keep], text=True,
                             capture_output=True, env=dict(os.environ, GIT_TERMINAL_PROMPT="0"))
        if pip.returncode:
            why = (pip.stderr.strip() or pip.stdout.strip() or "pip failed").splitlines()[-1]
            raise RuntimeError(f"could not install the course from {{source}} ({{why}}); offline? set COURSE_SOURCE "
                               "to a wheel, a folder or a pip requirement of the course") from None
        importlib.invalidate_caches()
        print(next((s for s in pip.stdout.splitlines() if s.startswith("Successfully")), "installed"), "from", source)
"""


def source_url() -> str:
    """The repository's address: ``[project.urls] Source`` of pyproject.toml."""
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Source"].rstrip("/")


def open_links(stem: str) -> dict:
    """``{"Colab": url, "Kaggle": url}`` opening ``notebooks/<stem>.ipynb`` of the repository's main branch."""
    path = source_url().removeprefix("https://github.com/") + f"/blob/{BRANCH}/notebooks/{stem}.ipynb"
    return {"Colab": f"https://colab.research.google.com/github/{path}",
            "Kaggle": f"https://kaggle.com/kernels/welcome?src=https://github.com/{path}"}


def links_markdown(stem: str) -> str:
    return " · ".join(f"[Open in {name}]({url})" for name, url in open_links(stem).items())


def first_cell() -> str:
    return FIRST_CELL.format(source=source_url())


def _lines(text: str) -> list:
    return text.splitlines(keepends=True)


def made(nb: dict, stem: str) -> dict:
    """``nb`` with its first code cell and its title cell's links as made from the address (a new dict)."""
    nb = json.loads(json.dumps(nb))
    cells = nb["cells"]
    title = [line for line in "".join(cells[0]["source"]).split("\n") if not line.startswith(LINKS)]
    at = next(i for i, line in enumerate(title) if line.startswith(("**Your time:**", "**Time:**")))
    title.insert(at, LINKS + links_markdown(stem) + " (the README's \"Run it on a free GPU\" says what each gives)")
    cells[0]["source"] = _lines("\n".join(title))
    cell = {"cell_type": "code", "execution_count": None, "id": CELL_ID, "metadata": {}, "outputs": [],
            "source": _lines(first_cell().rstrip("\n"))}
    first = next(i for i, c in enumerate(cells) if c["cell_type"] == "code")
    if cells[first].get("id") == CELL_ID:
        cells[first] = cell
    else:
        cells.insert(first, cell)
    return nb
