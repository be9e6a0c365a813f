# Two commands on a fresh clone:  `make demo` (the tutorial, end to end)  and  `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
# torch==2.13.0 (CPU) is pinned for set-up only: an unpinned torch pulls a multi-GB CUDA build.
export PIP_CONSTRAINT := $(CURDIR)/constraints.txt
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export PYTHONHASHSEED := 0

.PHONY: setup test lint pytest wheel-check demo docs docs-check bench gpu-check gpu-check-cuda clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e ".[hf,ray,openenv,test,docs]"
	touch $(STAMP)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

pytest: setup
	$(PY) -m pytest -q

test: lint pytest

# The package as a user gets it: sdist and wheel built (python -m build), the wheel installed in a
# fresh virtualenv outside the checkout (torch 2.13.0 CPU through constraints.txt), the README's
# quickstart and a smoke subset of the tests run there against it (.ci/wheel-check; ~2 min).
wheel-check: setup
	PY=$(CURDIR)/$(PY) .ci/wheel-check

demo: setup
	$(PY) tutorials/trl_interop.py

# The themed site, warnings as errors; executes the tutorial (sphinx-gallery). Offline-safe.
docs: setup
	$(PY) -m sphinx -W --keep-going -b html docs docs/_build/html

# Opens the built tutorial page in headless Chromium: figure loaded, summary lines shown.
# Needs a Chromium on PATH (or CHROMIUM=...); never installs one (.ci/run does, in CI).
docs-check: setup
	$(PY) docs/check_rendered.py docs/_build/html/auto_examples/trl_interop.html

# `make bench BENCH_1M=1` adds the 1M-row point to the HF views' scaling table (minutes, ~2 GB).
bench: setup
	$(PY) benchmarks/bench_dataset.py
	$(PY) benchmarks/bench_reward.py
	$(PY) benchmarks/bench_hf.py $(if $(BENCH_1M),--scale 10000 100000 1000000)
	$(PY) benchmarks/bench_grpo_reward.py
	$(PY) benchmarks/bench_remote.py
	$(PY) benchmarks/bench_ray.py
	$(PY) benchmarks/bench_online.py --all-layouts $(if $(BENCH_BEFORE),--before $(BENCH_BEFORE))
	$(PY) benchmarks/bench_openenv.py

# `make gpu-check`: the vLLM paths on one CUDA GPU (installs vllm first, which pins its own torch:
# run it in a separate environment); under 10 minutes. See docs/distributed.rst.
gpu-check: setup
	$(PY) -m pip install vllm
	$(PY) benchmarks/gpu_check.py

# `make gpu-check-cuda`: the package itself on one CUDA GPU, without vLLM, in a few minutes. Runs
# $(PYTHON), which needs a CUDA torch and the hf extra (the set-up venv's torch is the CPU build);
# GPU_CHECK_ARGS="--device cpu" runs the same checks on CPU. See docs/distributed.rst.
gpu-check-cuda:
	$(PYTHON) benchmarks/gpu_check_cuda.py $(GPU_CHECK_ARGS)

clean:
	rm -rf docs/_build docs/auto_examples docs/generated tutorials/outputs outputs
