"""pytest set-up shared by the unit tests and nbval: notebooks run in quick mode on the CPU."""
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent


def pytest_configure(config):
    # nbval starts each notebook's kernel with this environment; helpers.course_parameters reads it.
    os.environ["COURSE_QUICK"] = "1"
    os.environ["COURSE_DEVICE"] = "cpu"
    os.environ["COURSE_RESULTS_DIR"] = str(ROOT / "build" / "test-results")
    os.environ.setdefault("MPLBACKEND", "Agg")
