# dpsynth — the two commands a newcomer needs:
#   make demo   set up, start the embedded platform, run the main job end to end
#   make test   set up and run the whole test suite (unit, integration, e2e, boundaries)
#   make bench  run the benchmarks (BENCH_SCALE=cpu|full) and regenerate docs/benchmarks.md

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?= --durations=40

export PIP_DISABLE_PIP_VERSION_CHECK = 1

.PHONY: bench-long all venv demo test test-unit test-integration test-e2e lint boundaries clean bench

all: test

$(STAMP): shared/pyproject.toml services/*/pyproject.toml requirements/dev.txt requirements/constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first and exactly: 2.13.0 is the CPU build on this platform (no CUDA wheels pulled).
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -c requirements/constraints.txt -e shared -e services/ledger -e services/api \
		-e services/worker -e 'services/cli[embedded]' -r requirements/dev.txt
	# pytorch-fid's own InceptionV3 code, only for tests/unit/ml/evaluation/test_inception_reference.py
	# (run in a subprocess). Kept out of site-packages: PyPI's torchvision is a CUDA build whose
	# C extension does not load with the CPU torch, so `import torchvision` fails there.
	$(PIP) install -q --no-deps --upgrade --target $(VENV)/pytorch-fid-ref torchvision==0.28.0 pytorch-fid==0.3.0
	# jax_privacy's one-run auditing functions, only as the independent reference of
	# tests/unit/ml/test_one_run_audit.py (its auditing.py needs numpy, scipy and dp_accounting;
	# the package itself would pull JAX, so it is kept out of site-packages and loaded by path)
	$(PIP) install -q --no-deps --upgrade --target $(VENV)/jax-privacy-ref jax_privacy==2.0.0
	touch $(STAMP)

venv: $(STAMP)

# About 12.5 minutes on 2 idle cores (9 with DEMO_ARGS=--reuse-base-model after a first run).
# On a slow or loaded machine: make demo DEMO_ARGS=--quick
# (a smaller setting), or DEMO_ARGS=--reuse-base-model from the second run on (reuses the
# public base model the first run pretrained). No phase has a fixed deadline.
demo: $(STAMP)
	$(PY) scripts/demo.py $(DEMO_ARGS)

# Every benchmark at BENCH_SCALE (cpu: under 30 minutes on 2 cores; full: paper-sized, GPU),
# each writing benchmarks/results/NAME.json, then the tables of docs/benchmarks.md.
# BENCH_ONLY=service_load,dp_overhead runs a subset. See benchmarks/README.md.
BENCH_SCALE ?= cpu
# The Fashion-MNIST benchmark reads Debian's dataset-fashion-mnist (IDX files under
# /usr/share/datasets/fashion-mnist; nothing is downloaded at run time): installed once,
# idempotently, as .ci/run installs chromium; DPSYNTH_FMNIST_DIR=<dir> skips the check.
bench: $(STAMP)
	@if [ -z "$$DPSYNTH_FMNIST_DIR" ] && ! dpkg -s dataset-fashion-mnist >/dev/null 2>&1; then \
		( apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			--no-install-recommends dataset-fashion-mnist ) || { \
		echo "make bench: Debian's dataset-fashion-mnist is missing and could not be" \
			"installed; run 'apt-get install dataset-fashion-mnist' as root, or set" \
			"DPSYNTH_FMNIST_DIR to a folder with the Fashion-MNIST IDX files" >&2; exit 1; }; \
	fi
	BENCH_SCALE=$(BENCH_SCALE) $(PY) -m benchmarks.run_all

# The full Fashion-MNIST table at 3 seeds, 5,000-image corpora (hours on 2 cores)
bench-long: $(STAMP)
	$(MAKE) bench BENCH_ONLY=fmnist_table_long

boundaries: $(STAMP)
	$(VENV)/bin/lint-imports --config .importlinter

lint: $(STAMP)
	$(VENV)/bin/ruff check shared services tests scripts benchmarks
	$(VENV)/bin/mypy shared/src services/api/src services/ledger/src services/cli/src \
		services/worker/src

test: $(STAMP) boundaries lint
	$(PY) -m pytest -q -p no:cacheprovider tests $(PYTEST_ARGS)

test-unit: $(STAMP)
	$(PY) -m pytest -q tests/unit $(PYTEST_ARGS)

test-integration: $(STAMP)
	$(PY) -m pytest -q tests/integration $(PYTEST_ARGS)

test-e2e: $(STAMP)
	$(PY) -m pytest -q tests/e2e $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) out .dpsynth .pytest_cache
