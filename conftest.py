"""pytest set-up shared by the unit tests and nbval: notebooks run in quick mode on the CPU.

CIFAR-10 for tests comes from ../shared/data/cifar10-jpg.tar.gz (never committed), extracted once into
build/cifar10-jpg/ (ignored) and announced to the notebooks through COURSE_CIFAR10_DIR.
"""
import os
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent
CIFAR_TARBALL = ROOT.parent / "shared" / "data" / "cifar10-jpg.tar.gz"
CIFAR_DIR = ROOT / "build" / "cifar10-jpg"


def extract_cifar10():
    """The extracted image-folder tree, or None when the tarball is not on this machine."""
    tree = CIFAR_DIR / "CIFAR-10-images"
    if (tree / "test").is_dir() and (CIFAR_DIR / ".complete").exists():
        return tree
    if not CIFAR_TARBALL.exists():
        return None
    CIFAR_DIR.mkdir(parents=True, exist_ok=True)
    with tarfile.open(CIFAR_TARBALL) as tar:
        tar.extractall(CIFAR_DIR, filter="data")
    (CIFAR_DIR / ".complete").touch()
    return tree


def pytest_configure(config):
    # nbval starts each notebook's kernel with this environment; helpers.course_parameters reads it.
    os.environ["COURSE_QUICK"] = "1"
    os.environ["COURSE_DEVICE"] = "cpu"
    os.environ["COURSE_RUN_SOLUTIONS"] = "1"  # solution cells only show their code to a learner; CI runs them
    os.environ["COURSE_RESULTS_DIR"] = str(ROOT / "build" / "test-results")
    os.environ.setdefault("MPLBACKEND", "Agg")
    tree = extract_cifar10()
    if tree is not None:
        os.environ.setdefault("COURSE_CIFAR10_DIR", str(tree))
