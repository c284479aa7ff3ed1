# The course's commands. `make run` and `make test` create .venv on first use.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
QUICK  ?= 0
DEVICE ?= auto
ONLY   ?=
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

.PHONY: help venv run test lab bench gpu-check clean

help:
	@echo "make run    execute every notebook (QUICK=1 for quick mode, DEVICE=cpu|cuda|mps) into build/"
	@echo "make test   unit tests of helpers, nbval over the notebooks, papermill runs (CPU, quick)"
	@echo "make lab    open JupyterLab on notebooks/"
	@echo "make bench  run the benchmark scripts in benchmarks/"
	@echo "make gpu-check  full-mode notebooks + benchmarks, results into \$$OUT (for a GPU machine)"

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "Installing the course into $(VENV) (first time: a few minutes, PyTorch is large)..."
	$(PY) -m pip install --quiet --disable-pip-version-check -e ".[dev]" 2>&1 | grep -v "^WARNING: Location" || true
	@$(PY) -c "import torch, torchvision, helpers, nbval, papermill" || { echo "install failed: see the pip output above"; exit 1; }
	@touch $@

run: venv
	$(PY) tools/run_course.py --device $(DEVICE) $(if $(filter 1 true True yes,$(QUICK)),--quick,) $(if $(ONLY),--only $(ONLY),)

test: venv
	$(PY) -m pytest

lab: venv
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks $(ROOT_FLAG)

bench: venv
	@for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

gpu-check: venv
	@test -n "$(OUT)" || { echo "set OUT=<folder for the results>"; exit 2; }
	-$(PY) tools/run_course.py --device $(DEVICE) --out $(OUT) --keep-going
	@for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b | tee -a $(OUT)/benchmarks.txt || exit 1; done
	@echo "Promote the results to references with: $(PY) tools/promote_reference.py $(OUT)/results"

clean:
	rm -rf build
