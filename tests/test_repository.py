"""The set-up files agree with each other: pyproject, environment.yml, Makefile, .ci/run, README."""
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def _pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_environment_yml_matches_pyproject():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert env["channels"] == ["conda-forge"]
    deps = env["dependencies"]
    pythons = [d for d in deps if isinstance(d, str) and d.startswith("python")]
    assert pythons == ["python" + _pyproject()["project"]["requires-python"]], "same Python range as pyproject.toml"
    assert "pip" in deps
    pip_section = [d for d in deps if isinstance(d, dict)]
    assert pip_section == [{"pip": ["-e .[dev]"]}], "pip installs this project (and only it): versions live in pyproject"
    conda_packages = [d for d in deps if isinstance(d, str) and d not in ("pip",) and not d.startswith("python")]
    assert conda_packages == [], f"a second list of packages would drift from pyproject.toml: {conda_packages}"


def test_dependencies_the_issue_names_are_declared():
    proj = _pyproject()["project"]
    names = {re.split(r"[<>=\[ ]", d)[0].lower() for d in proj["dependencies"] + proj["optional-dependencies"]["dev"]}
    for needed in ("torch", "torchvision", "matplotlib", "tqdm", "jupyterlab", "ipykernel", "ipywidgets", "nbval",
                   "papermill", "pytest"):
        assert needed in names, needed


def test_makefile_and_ci_entry_points():
    make = (ROOT / "Makefile").read_text()
    for target in ("run", "test", "lab", "bench", "gpu-check", "site", "check"):
        assert re.search(rf"^{re.escape(target)}:", make, re.M), f"Makefile lacks `{target}`"
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci
    assert "COURSE_REQUIRE_BROWSER=1" in ci and "apt-get install -y -q chromium" in ci  # browser tests run in CI


def test_site_extra_stays_out_of_make_run():
    proj = _pyproject()["project"]
    site = {re.split(r"[<>=\[ ]", d)[0].lower() for d in proj["optional-dependencies"]["site"]}
    dev = {re.split(r"[<>=\[ ]", d)[0].lower() for d in proj["optional-dependencies"]["dev"]}
    assert {"sphinx", "myst-nb", "playwright"} <= site and not site & dev
    make = (ROOT / "Makefile").read_text()
    assert re.search(r"^run: venv$", make, re.M) and re.search(r"^test: site-venv$", make, re.M)


def test_readme_has_the_two_commands_and_every_notebook():
    readme = (ROOT / "README.md").read_text()
    assert "make run" in readme and "make test" in readme
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        assert nb.name in readme, f"README's course map lacks {nb.name}"


def test_runner_rejects_a_bad_device_before_starting_anything(tmp_path):
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "run_course.py"), "--device", "tpu", "--out",
                          str(tmp_path / "b")], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert run.stderr.strip().startswith("error: unknown device 'tpu'") and len(run.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "b").exists()


def test_runner_names_failing_notebook_and_cell(tmp_path):
    import nbformat

    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("quick = False\ndevice = 'auto'")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell("print('fine')"), nbformat.v4.new_code_cell("1 / 0")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, nbdir / "98_broken.ipynb")
    code = (f"import sys; sys.path.insert(0, {str(ROOT / 'tools')!r}); import run_course; "
            f"from pathlib import Path; run_course.ROOT = Path({str(tmp_path)!r}); "
            f"sys.exit(run_course.main(['--quick', '--device', 'cpu', '--out', {str(tmp_path / 'b')!r}]))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 1
    assert "[1/1] 98_broken.ipynb ... FAILED" in run.stdout
    assert "notebooks/98_broken.ipynb failed in cell 3 (counting from 1, `1 / 0`)" in run.stderr and "ZeroDivisionError" in run.stderr


def test_promote_reference_copies_full_mode_results_only(tmp_path, monkeypatch):
    sys.path.insert(0, str(ROOT / "tools"))
    import promote_reference

    from helpers import results

    src = tmp_path / "results"
    hw = {"name": "1x-test-gpu", "cpu": "x", "cpu_cores": 1, "gpus": [{"name": "Test GPU"}], "torch": "2.x"}
    results.save_results("02_demo", {"v": 1, "measured_over_predicted": {"conv": {"8": 1.4}}}, quick=False,
                         device="cuda:0", out_dir=src, hardware=hw)
    results.save_results("03_demo", {"v": 1}, quick=True, device="cuda:0", out_dir=src, hardware=hw)
    results.save_results("04_demo", {"v": 1}, quick=False, device="cpu", out_dir=src, hardware=hw)
    stopped = results.save_results("05_demo", {"v": 1}, quick=False, device="cuda:0", out_dir=src, hardware=hw,
                                   budget_s=60)
    record = json.loads(stopped.read_text())
    stopped.write_text(json.dumps(dict(record, stopped=True)))  # as tools/run_course.py marks a stopped notebook
    monkeypatch.setattr(promote_reference, "reference_dir", lambda: tmp_path / "reference")
    assert promote_reference.main([str(src)]) == 0
    folder = tmp_path / "reference" / "1x-test-gpu"
    assert sorted(p.name for p in folder.iterdir()) == ["02_demo.json", "prediction_check.json"]
    check = json.loads((folder / "prediction_check.json").read_text())
    assert check["notebooks"] == {"02_demo": {"conv": {"8": 1.4}}} and check["hardware"]["name"] == "1x-test-gpu"
    assert promote_reference.main([str(tmp_path / "empty")]) == 2
    packed = results.pack_results(src)  # a learner's download from a hosted lesson
    assert packed == tmp_path / "results-1x-test-gpu.zip"
    monkeypatch.setattr(promote_reference, "reference_dir", lambda: tmp_path / "from-zip")
    assert promote_reference.main([str(packed)]) == 0
    assert sorted(p.name for p in (tmp_path / "from-zip" / "1x-test-gpu").iterdir()) == ["02_demo.json",
                                                                                         "prediction_check.json"]


def test_budget_shares_cover_every_notebook_and_add_up_to_the_budget():
    """make gpu-check's BUDGET_MIN is split over the notebooks: every notebook gets a share, and they sum to 1."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import run_course
    finally:
        sys.path.remove(str(ROOT / "tools"))
    prefixes = {nb.name[:2] for nb in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    assert set(run_course.BUDGET_SHARE) == prefixes
    assert abs(sum(run_course.BUDGET_SHARE.values()) - 1.0) < 1e-9


def test_a_gpu_run_gives_its_gpu_floors_of_its_own(tmp_path):
    """promote_reference keeps a full-mode GPU run's times as that GPU's floors (the smaller of old and new), and
    the next run on that GPU plans from them; quick or CPU runs record none (issue 34: CPU floors are not GPU floors)."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import promote_reference
        import run_course
    finally:
        sys.path.remove(str(ROOT / "tools"))
    floors_path = tmp_path / "floors.json"
    floors_path.write_text((ROOT / "data" / "budget_floors.json").read_text())
    cpu_05 = json.loads(floors_path.read_text())["kinds"]["cpu"]["floors_s"]["05_multi_gpu_training"]

    def times(seconds_00, **kw):
        path = tmp_path / "times.json"
        path.write_text(json.dumps(dict({"machine": "1x NVIDIA H200", "gpu": True, "kind": "NVIDIA H200",
                                         "torch": "2.11", "quick": False, "date": "2026-12-06", "runs": {
                                             "00_getting_started": {"status": "ok", "seconds": seconds_00},
                                             "05_multi_gpu_training": {"status": "stopped", "seconds": 99.0}}},
                                        **kw)))
        return path

    assert not run_course.load_floors("NVIDIA H200", floors_path)[2], "never recorded: the CPU's floors, learned"
    assert "kept for 1" in promote_reference.keep_floors(times(4.0), floors_path)
    floors, source, own = run_course.load_floors("NVIDIA H200", floors_path)
    assert own and floors["00"] == 4.0 and floors["05"] == cpu_05 and "NVIDIA H200" in source, "05 was stopped"
    promote_reference.keep_floors(times(6.0), floors_path)
    assert run_course.load_floors("NVIDIA H200", floors_path)[0]["00"] == 4.0, "the smaller time is kept"
    assert run_course.load_floors("cpu", floors_path)[0]["05"] == cpu_05, "the CPU's floors are untouched"
    assert "not" in promote_reference.keep_floors(times(1.0, quick=True), floors_path)
    assert run_course.load_floors("NVIDIA H200", floors_path)[0]["00"] == 4.0


def test_the_constraints_pin_what_ci_tested_and_the_makefile_uses_them():
    """constraints.txt: plain pins (no local build label such as +cu130) of every package pyproject names, for
    the Python CI ran; the Makefile installs through it; pyproject keeps ranges, whose floors the pins satisfy."""
    from packaging.requirements import Requirement

    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            req = Requirement(line)
            spec = str(req.specifier)
            assert spec.startswith("==") and "+" not in spec and "*" not in spec, line
            assert str(req.marker) == 'python_version == "3.11"', line
            pins[req.name.lower()] = spec[2:]
    proj = _pyproject()["project"]
    for dep in proj["dependencies"] + sum(proj["optional-dependencies"].values(), []):
        req = Requirement(dep)
        assert req.name.lower() in pins, f"{req.name} has no pin in constraints.txt"
        assert req.specifier.contains(pins[req.name.lower()]), f"{req.name}=={pins[req.name.lower()]} outside {dep}"
    make = (ROOT / "Makefile").read_text()
    installs = [line for line in make.splitlines() if "pip install" in line]
    assert installs and all("-c constraints.txt" in line for line in installs), installs
    assert make.count(": pyproject.toml constraints.txt") == 2, "both installs redo when either file changes"


def test_cpu_floors_keep_the_slowest_machine_measured(tmp_path):
    """CPU machines differ (CI's too): a floor measured on a second CPU replaces the first only where it is larger,
    so the plan holds on the slowest CPU measured; both machines are named."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import run_course
    finally:
        sys.path.remove(str(ROOT / "tools"))
    path = tmp_path / "floors.json"
    how = "measured: tools/run_course.py --measure-floors (budget_s=1)"
    run_course.record_floors("cpu", {"00_a": 5.0, "01_b": 20.0}, "CPU one", "2.14", how, path)
    run_course.record_floors("cpu", {"00_a": 7.0, "01_b": 15.0}, "CPU two", "2.14", how, path)
    floors, source, own = run_course.load_floors("cpu", path)
    assert floors == {"00": 7.0, "01": 20.0} and own
    assert "CPU one" in source and "CPU two" in source
    run_course.record_floors("cpu", {"00_a": 9.0}, "CPU three", "2.14", how, path)  # each machine named once, dated
    machine = json.loads(path.read_text())["kinds"]["cpu"]["machine"]
    assert machine.count("the larger floor of") == 1 and machine.count(")") == 3, machine
    run_course.record_floors("cpu", {"01_b": 25.0}, "CPU one", "2.14", how, path)  # measured again: still all three
    machine = json.loads(path.read_text())["kinds"]["cpu"]["machine"]
    assert machine.count(")") == 3 and "CPU two" in machine and "CPU three" in machine, machine
    assert run_course.load_floors("cpu", path)[0] == {"00": 9.0, "01": 25.0}
