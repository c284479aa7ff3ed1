# The course's commands. `make run` and `make test` create .venv on first use.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
QUICK  ?= 0
DEVICE ?= auto
ONLY   ?=
# gpu-check (an offline GPU node): the wheelhouse of notebook tools (for the node's Python WHEEL_PYTHON), CIFAR-10
# folder or tarball, time budget in minutes (everything included: the run ends by BUDGET_MIN + 45 s at the latest)
WHEEL_PYTHON ?= 3.12
WHEELHOUSE ?= build/wheelhouse
CIFAR10    ?=
BUDGET_MIN ?= 7
GPU_DEVICE ?= $(if $(filter auto,$(DEVICE)),cuda,$(DEVICE))
ALLOW_CPU  ?=
BENCH      ?= 1
PLAN       ?=
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

.PHONY: help venv site-venv run test lab bench site check instructors gpu-check hosted-check wheelhouse clean

help:
	@echo "make run    execute every notebook (QUICK=1 for quick mode, DEVICE=cpu|cuda|mps) into build/"
	@echo "make test   unit tests of helpers, nbval over the notebooks, papermill runs (CPU, quick)"
	@echo "make lab    open JupyterLab on notebooks/"
	@echo "make bench  run the benchmark scripts in benchmarks/"
	@echo "make site   the executed course as a static website in build/site/ (QUICK=1: run stale notebooks quick)"
	@echo "make check  pre-flight check of this machine for a workshop (writes build/preflight.md)"
	@echo "make wheelhouse  download the notebook tools as wheels for an offline GPU node (WHEEL_PYTHON=3.12)"
	@echo "make gpu-check OUT=dir [PYTHON=python3 CIFAR10=dir|tar.gz BUDGET_MIN=7 PLAN=1]  the course on a GPU node"
	@echo "make hosted-check [ONLY=03,05 CIFAR10=dir]  each lesson alone in a fresh Python, as on Colab or Kaggle"
	@echo "               (PLAN=1: a dry run that prints each notebook's budget and limit and runs nothing)"

venv: $(VENV)/.installed

# $(call install,EXTRAS,MODULES): the course and its EXTRAS into .venv with one pip run, then MODULES imported as proof.
# constraints.txt: the versions CI tested (pins for Python 3.11; other Pythons resolve pyproject's ranges)
define install
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "Installing the course into $(VENV) (first time: a few minutes, PyTorch is large)..."
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[$(1)]" 2>&1 | grep -v "^WARNING: Location" || true
	@$(PY) -c "import importlib, sys; [importlib.import_module(m) for m in sys.argv[1:]]" $(2) \
		|| { echo "install failed: see the pip output above"; exit 1; }
endef
comma := ,
RUN_MODULES := torch torchvision helpers nbval papermill xdist

$(VENV)/.installed: pyproject.toml constraints.txt
	$(call install,dev,$(RUN_MODULES))
	@touch $@

# The site generator and the browser-test driver: an extra that `make run` does not need. make test installs both
# extras in one pip run (a second run that finds everything installed still takes about 20 s).
site-venv: $(VENV)/.site-installed

$(VENV)/.site-installed: pyproject.toml constraints.txt
	$(call install,dev$(comma)site,$(RUN_MODULES) sphinx myst_nb playwright)
	@touch $(VENV)/.installed $@

run: venv
	$(PY) tools/run_course.py --device $(DEVICE) $(if $(filter 1 true True yes,$(QUICK)),--quick,) $(if $(ONLY),--only $(ONLY),)

# After pytest, tools/course_times.py --check lists the recorded times that measured an earlier version of their
# notebook: stale times are reported, not a failure; a README map or instructor kit that disagrees with
# data/course_times.json fails (here and in tests/test_course_times.py).
#
# Two passes. The first shares the cores among TEST_WORKERS pytest-xdist workers, a file to a worker (a notebook's
# cells run in order in one kernel); the second runs one test at a time: those marked serial (they time real work or
# watch the whole checkout), those that read the notebooks the first pass executed, and the browser tests.
# OMP_WAIT_POLICY=PASSIVE in the first pass: torch's idle OpenMP threads sleep instead of spinning, or two workers'
# threads on 2 cores spin against each other (measured on 4 lessons: 115 s spinning, 72 s passive, 99 s one at a time).
# Before it, this machine's ceilings (cached, read by diagnose's verdicts and the lessons' MFU) are measured alone,
# with one thread and with torch's default; a failure in the first pass still lets the second run, then fails.
TEST_WORKERS ?= 2
test: site-venv
	$(PY) -c "import torch; from helpers.ceilings import measured_ceilings; \
		[(torch.set_num_threads(n), measured_ceilings('cpu')) for n in sorted({1, torch.get_num_threads()})]"
	status=0; \
	OMP_WAIT_POLICY=PASSIVE $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile \
		-m "not serial and not executed and not browser" || status=$$?; \
	$(PY) -m pytest -m "serial or executed or browser" || status=$$?; \
	exit $$status
	$(PY) tools/course_times.py --check

site: site-venv
	$(PY) tools/build_site.py --device $(DEVICE) $(if $(filter 1 true True yes,$(QUICK)),--quick,) \
		$(if $(ONLY),--only $(ONLY),)

check: venv
	$(PY) tools/preflight.py

lab: venv
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks $(ROOT_FLAG)

# Each lesson as Colab or Kaggle opens it: alone in an empty folder of a fresh Python without the course, whose
# first cell installs the course from a wheel of this checkout (offline). CIFAR10: an image-folder tree.
hosted-check: venv
	$(PY) tools/hosted_check.py $(if $(CIFAR10),--cifar10 $(CIFAR10),) $(if $(ONLY),--only $(ONLY),)

bench: venv
	@for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

# No venv here: the GPU node's own Python (PYTHON=python3) must already have torch; what it lacks for running
# notebooks comes from WHEELHOUSE, installed into OUT/site (never into that Python).
gpu-check:
	@test -n "$(OUT)" || { echo "set OUT=<folder for the results>"; exit 2; }
	$(PYTHON) tools/gpu_check.py --out $(OUT) --wheelhouse $(WHEELHOUSE) --budget-min $(BUDGET_MIN) \
		--device $(GPU_DEVICE) $(if $(CIFAR10),--cifar10 $(CIFAR10),) $(if $(ALLOW_CPU),--allow-cpu,) \
		$(if $(filter 1 true True yes,$(QUICK)),--quick,) $(if $(ONLY),--only $(ONLY),) \
		$(if $(filter 0,$(BENCH)),--no-bench,) $(if $(filter 1 true True yes,$(PLAN)),--plan,)

# Pinned wheels of the notebook tools (tools/gpu-check-requirements.txt) for CPython $(WHEEL_PYTHON) on manylinux x86-64.
wheelhouse:
	$(PYTHON) -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
		--python-version $(WHEEL_PYTHON) --implementation cp --platform manylinux_2_28_x86_64 \
		--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
		-r tools/gpu-check-requirements.txt -d $(WHEELHOUSE)
	@ls $(WHEELHOUSE); du -sh $(WHEELHOUSE)

clean:
	rm -rf build
