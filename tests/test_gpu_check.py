"""`make gpu-check` on an offline node whose Python has torch but no notebook tools, proven on this CPU machine.

A throw-away virtual environment sees torch, torchvision, numpy, matplotlib, pandas and tqdm (linked from this
project's .venv, as a GPU node's site Python has them) and none of the Jupyter tools. gpu-check must install those
from a wheelhouse with --no-index into its scratch folder, leave the node's Python as it was, run a notebook
through that path (on the CPU, allowed explicitly), and refuse in one line when no GPU is there.
"""
import json
import os
import re
import tarfile
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import checkout_files

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
try:
    import hosted_check  # the stand-in of a Python that has torch but not the course
finally:
    sys.path.remove(str(ROOT / "tools"))
WHEELHOUSE = ROOT / "build" / "test-wheelhouse"
# One at a time (make test's second pass): the module's node stand-in is built once, and the run compares the whole
# checkout before and after, so no other test may write into it meanwhile.
pytestmark = pytest.mark.serial
NODE_PACKAGES = ["torch", "torchvision", "numpy", "matplotlib", "pandas", "tqdm"]
NOTEBOOK_TOOLS = {"papermill", "nbclient", "nbformat", "ipykernel", "jupyter-client", "ipython", "pyzmq"}


def _node_python(tmp_path) -> Path:
    assert not NOTEBOOK_TOOLS & set(hosted_check.closure(NODE_PACKAGES)), "the node stand-in sees notebook tools"
    return hosted_check.runtime_python(tmp_path, NODE_PACKAGES, own_pip=True)


def _wheelhouse():
    if any(WHEELHOUSE.glob("papermill-*.whl")):
        return
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    run = subprocess.run(["make", "-s", "wheelhouse", f"WHEEL_PYTHON={ver}", f"WHEELHOUSE={WHEELHOUSE}",
                          f"PYTHON={sys.executable}"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    if run.returncode != 0:
        if os.environ.get("CI"):
            pytest.fail(f"make wheelhouse failed in CI: {run.stderr[-1500:]}")
        pytest.skip("no package index reachable to build the test wheelhouse (make wheelhouse); CI runs this")


def _env():
    env = {k: v for k, v in os.environ.items() if not k.startswith("COURSE_") and k != "PYTHONPATH"}
    return env


def _gpu_check(node, out, *settings, timeout=900):
    """``make gpu-check`` with the node stand-in's Python, this test wheelhouse and ``settings`` (NAME=value)."""
    return subprocess.run(["make", "-s", "gpu-check", f"PYTHON={node}", f"OUT={out}", f"WHEELHOUSE={WHEELHOUSE}",
                           *settings], cwd=ROOT, capture_output=True, text=True, env=_env(), timeout=timeout)


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    _wheelhouse()
    return _node_python(tmp_path_factory.mktemp("gpu-node"))


def test_node_stand_in_has_torch_and_no_notebook_tools(node):
    probe = "import torch, torchvision, matplotlib, pandas, tqdm; import importlib.util as u; " \
            "print([m for m in ('papermill', 'nbclient', 'ipykernel', 'IPython') if u.find_spec(m)])"
    out = subprocess.run([str(node), "-c", probe], capture_output=True, text=True, env=_env(), timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_gpu_check_refuses_without_a_gpu_in_one_line(node, tmp_path):
    run = _gpu_check(node, tmp_path / "out", timeout=300)
    assert run.returncode != 0
    lines = [ln for ln in run.stderr.splitlines() if ln.startswith("gpu-check:")]
    assert len(lines) == 1 and "no usable CUDA GPU" in lines[0], run.stderr[-2000:]
    assert not (tmp_path / "out").exists(), "nothing is written before the checks pass"


def test_gpu_check_installs_tools_from_wheelhouse_and_runs_a_notebook(node, tmp_path):
    out = tmp_path / "out"
    before = checkout_files()
    run = _gpu_check(node, out, "DEVICE=cpu", "ALLOW_CPU=1", "QUICK=1", "ONLY=00,05", "BENCH=0")  # no CIFAR10
    after = checkout_files()
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    assert changed == [], f"gpu-check wrote into the repository (everything belongs under OUT): {changed[:20]}"
    assert "gpu-check: pre-flight: C compiler" in run.stdout or "PROBLEM: no" in run.stdout
    assert len(list(out.glob("gpu-check-*.tar.gz"))) == 1, "one archive to copy off the node"
    with tarfile.open(next(out.glob("gpu-check-*.tar.gz"))) as tar:
        names = tar.getnames()
    assert {"times.json", "report.md", "preflight.txt", "results/00_getting_started.json"} <= set(names)
    assert "papermill" in run.stdout
    assert re.search(r"\[1/\d\] 00_getting_started.ipynb \.\.\. \(budget \d+ s, limit \d+ s\) done in", run.stdout)
    assert "05_multi_gpu_training.ipynb: skipped: it needs CIFAR-10" in run.stdout  # and the run goes on to exit 0
    rec = (out / "results" / "00_getting_started.json").read_text()
    assert '"quick": true' in rec and '"device": "cpu"' in rec
    assert (out / "notebooks" / "00_getting_started.ipynb").exists()
    assert any((out / "site").glob("papermill*")), "the tools went into the scratch folder"
    still = subprocess.run([str(node), "-c", "import papermill"], capture_output=True, env=_env(), timeout=120)
    assert still.returncode != 0, "the node's own Python must be left without the tools"


def test_make_wheelhouse_as_written_names_an_integer_python_version():
    """The plain command of the README: the Makefile once had two things called PY (`.venv/bin/python`)."""
    run = subprocess.run(["make", "-n", "wheelhouse"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    version = re.search(r"--python-version (\S+)", run.stdout).group(1)
    assert re.fullmatch(r"\d+\.\d+", version), run.stdout


def test_merge_runs_makes_one_report_of_two_halves(tmp_path):
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import merge_runs
    finally:
        sys.path.remove(str(ROOT / "tools"))
    from helpers import results

    hw = {"name": "1x-test-gpu", "cpu": "x", "cpu_cores": 1, "gpus": [{"name": "Test GPU"}], "torch": "2.x"}
    for half, name in (("a", "00_demo"), ("b", "01_demo")):
        results.save_results(name, {"v": half}, quick=False, device="cuda:0", out_dir=tmp_path / half / "results",
                             hardware=hw, budget_s=60)
        (tmp_path / half / "times.json").write_text(json.dumps({
            "machine": "1x Test GPU", "gpu": True, "quick": False, "date": "2026-12-05", "budget_s": 200,
            "notebooks": {name: 50.0}, "runs": {name: {"status": "ok", "seconds": 50.0}}}))
    assert merge_runs.main([str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "all")]) == 0
    merged = json.loads((tmp_path / "all" / "times.json").read_text())
    assert merged["notebooks"] == {"00_demo": 50.0, "01_demo": 50.0} and merged["budget_s"] == 400
    report = (tmp_path / "all" / "report.md").read_text()
    assert "## 00_demo" in report and "## 01_demo" in report and "| 01_demo | ok |" in report
    (tmp_path / "b" / "times.json").write_text(json.dumps({"machine": "2-core CPU", "gpu": False, "quick": False,
                                                           "notebooks": {}, "runs": {}}))
    assert merge_runs.main([str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "x")]) == 2


def test_node_preflight_names_a_missing_compiler(monkeypatch, tmp_path, capsys):
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import preflight
    finally:
        sys.path.remove(str(ROOT / "tools"))
    monkeypatch.setenv("CC", "/nonexistent/cc")
    assert "C compiler" in preflight.compiler_problem()
    monkeypatch.setattr(preflight, "pinned", lambda: {"pytest": "999.0"})
    assert "pytest" in preflight.outdated_tools()
    found = preflight.node(tmp_path, "cpu")
    assert found["no_compile"] and set(found["outdated"]) == {"pytest"}
    assert any(line.startswith("PROBLEM: pytest") for line in found["lines"])
    assert "gpu-check: pre-flight: PROBLEM: torch.compile cannot" in capsys.readouterr().out


def test_a_relative_out_is_the_callers_folder_for_the_notebook_run(tmp_path, monkeypatch):
    """run_course runs with the repository as its working directory, so gpu_check hands it an absolute --out: a
    relative OUT means the folder the caller named, as it does for the archive."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(ROOT / "tools"))
    monkeypatch.chdir(tmp_path)
    cmd = gpu_check.course_command(gpu_check._parse(["--out", "run-a"]), "cuda", 100.0, 1000.0, True)
    assert cmd[cmd.index("--out") + 1] == str(tmp_path / "run-a")


@pytest.mark.parametrize("scratch", ["gpu_check", "hosted_check"])
def test_the_runs_processes_compile_once_into_the_bytecode_prefix(scratch, tmp_path, monkeypatch):
    """gpu-check and the hosted stand-in point PYTHONPYCACHEPREFIX at a fresh folder, so Python reads compiled
    modules only from there. A shell's PYTHONDONTWRITEBYTECODE=1 (this machine's) left that folder empty and made
    every kernel and DDP worker compile torch again (9.9 s against 3.9 s for one import here): their processes
    must write it."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(ROOT / "tools"))
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    env = gpu_check.scratch_env(tmp_path, tmp_path / "site", None) if scratch == "gpu_check" else \
        hosted_check.runtime_env(tmp_path, None)
    subprocess.run([sys.executable, "-c", "import email.mime.text"], env=env, check=True, timeout=120)
    written = list(Path(env["PYTHONPYCACHEPREFIX"]).rglob("*.pyc"))
    assert any(p.name.startswith("text.") for p in written), written[:5]
