# Set-up is one virtual environment at .venv, made once from Python 3.12 and
# reused on every later call (it is rebuilt only when pyproject.toml changes).
VENV := .venv
# optional extras beside dev and notebooks: `make setup EXTRAS=cuda12` (or cuda13) for an NVIDIA GPU
EXTRAS ?=
comma := ,
STAMP := $(VENV)/.installed$(if $(EXTRAS),-$(subst $(comma),-,$(EXTRAS)))
# The first Python 3.12 that actually runs: a pyenv shim named python3.12 can
# exist without working, so each candidate is tried, not just found.
PYTHON312 ?= $(shell for p in python3.12 $$HOME/.pyenv/versions/3.12*/bin/python3.12 /usr/local/bin/python3.12 /usr/bin/python3.12; do \
	$$p -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null && { echo $$p; break; }; done)

.PHONY: setup train test test-quick check-gpu-install

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -n "$(PYTHON312)" || { echo "tmem needs Python 3.12 (python3.12 was not found or does not run)"; exit 1; }
	test -x $(VENV)/bin/python || $(PYTHON312) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[dev,notebooks$(if $(EXTRAS),$(comma)$(EXTRAS))]'
	touch $(STAMP)

train: setup
	$(VENV)/bin/python train.py $(ARGS)

# the 25 slowest tests close the report: where the suite's 15-minute budget goes, in every CI log
test: setup
	$(VENV)/bin/python -m pytest -n 2 --dist worksteal --durations=25 $(ARGS)

test-quick: setup
	$(VENV)/bin/python -m pytest -n 2 --dist worksteal -m "not slow and not notebook" $(ARGS)

# pip's dry run of the GPU extras: they resolve, and the CUDA plugin is jax's own release (nothing is installed)
check-gpu-install:
	bash benchmarks/check_gpu_install.sh $(EXTRAS)
