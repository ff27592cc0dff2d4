# The two commands of the README. Each creates or reuses .venv and installs torch first,
# the build that fits this machine (autosearch/_torch_build.py decides and says why):
# the one pip's configuration provides, else the CUDA build where nvidia-smi lists an
# NVIDIA GPU, else the CPU build from PyTorch's CPU index (--index-url), not the
# multi-GB CUDA build an unpinned `pip install torch` takes; then the project.
VENV ?= .venv
TORCH ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test test-loaded docs lint torch-plan clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	python3 autosearch/_torch_build.py $(PY) $(TORCH)
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/autosearch run studies/digits_quick.py

# The project's bytecode, written once: the suite starts ~200 Python processes, and where
# PYTHONDONTWRITEBYTECODE is set (as on this project's CI machines) each would compile
# every autosearch module it imports again.
BYTECODE := $(PY) -m compileall -q autosearch search_spaces controllers benchmarks

# Two test processes, a test file each at a time (pytest-xdist), one thread each.
test: $(STAMP)
	$(BYTECODE)
	$(PY) -m pytest -q -n 2 --dist loadfile

# The fault and worker tests beside processes that keep every core busy (tests/loaded.py):
# what a loaded CI machine does to tests that lean on timing. Run before stopping.
test-loaded: $(STAMP)
	$(BYTECODE)
	$(PY) tests/loaded.py

# The documentation site, every tutorial executed, into docs/_build/html (opens offline).
# Warnings are errors; a tutorial that raises fails the build with its name.
docs: $(STAMP)
	$(BYTECODE)
	$(VENV)/bin/sphinx-build -W --keep-going -q -b html docs docs/_build/html
	@echo "docs: open docs/_build/html/index.html"

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# Which torch build the set-up installs here, and on a fresh machine (pip's
# configuration ignored); installs nothing.
torch-plan:
	python3 autosearch/_torch_build.py python3 $(TORCH) --dry-run
	python3 autosearch/_torch_build.py python3 $(TORCH) --dry-run --isolated

clean:
	rm -rf runs docs/_build docs/tutorials
