# Two commands a user needs (see README): `make run` and `make test`. While changing code,
# `make test-fast` runs the unit tier alone (tests that start no process, under 2 minutes).
# Both create .venv on first use. TORCH_SPEC picks the torch build:
#   CPU-only machine (default): torch==2.13.0 (the CPU wheel; no CUDA downloads)
#   NVIDIA GPU machine:         make run TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cu128"
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
CORES ?= all

.PHONY: setup run test test-fast lint report browser slurm clean-results gpu-bundle gpu-check

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q $(TORCH_SPEC)
	$(VENV)/bin/pip install -q -e '.[test]'
	# The SLURM executor plugin goes in its own folder, on PYTHONPATH only for SLURM use:
	# Snakemake imports every installed plugin at start, and this one runs `scontrol`, which
	# waits ~9 s on a machine with SLURM's tools but no controller (every start, seen here).
	$(VENV)/bin/pip install -q --no-deps --target $(VENV)/slurm-plugin \
		snakemake-executor-plugin-slurm==2.8.0 snakemake-executor-plugin-slurm-jobstep==0.6.1
	# matplotlib builds its font cache on first import, running fc-list: here, once, not inside the unit
	# tier (which refuses to start programs) on a machine whose cache is new
	$(VENV)/bin/python -c 'import matplotlib.pyplot'
	touch $@

setup: $(VENV)/.installed

run: setup
	$(VENV)/bin/snakemake --cores $(CORES)

# Two pytest workers: the suite waits on process start-ups and timeouts a good part of the time,
# so two workers on a 2-core machine overlap those waits. Not -n auto: every multi-rank test
# starts 2-4 ranks of its own, so a worker per core is the most a machine should take. Each
# worker takes whole test files (module fixtures such as the parity runs are built once), except
# run and workflow tests that share no fixture, taken one by one; the costliest first (tests/conftest.py orders them;
# --no-loadscope-reorder keeps that order), so no long file starts last while the other idles.
TEST_WORKERS ?= 2

test: setup
	$(VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder --durations=30

# The unit tier, tests/unit/ (a test's tier is its folder: tests/<tier>/): tests that start no process
# (no run, no Snakemake, no CLI in a subprocess), checked by tests/conftest.py. Whole files per worker
# would leave one worker with the biggest file: unit tests are independent, so they are dealt out one by one.
test-fast: setup
	$(VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) -m unit --durations=10

# What CI checks before any test (seconds): the code style, the workflow's own lint, the import layers.
lint: setup
	$(VENV)/bin/ruff check src tests workflow
	$(VENV)/bin/snakemake --lint --cores 1
	$(VENV)/bin/lint-imports --no-cache

report: setup
	$(VENV)/bin/snakemake --cores $(CORES) report

# Optional: Chromium (Debian package) for the test that opens the report in a real browser;
# without it that one test is skipped with its reason. Needs root (apt-get).
browser:
	@command -v chromium >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium)

# Optional: SLURM and munge (Debian packages), and ip/tc (iproute2), for the tests that run the
# workflow through a real 2-node SLURM cluster on this machine (devtools.vcluster: one
# network namespace per node); without them those tests are skipped with their reason. Needs root.
slurm:
	@(command -v slurmctld && command -v munged && command -v tc && command -v nsenter) >/dev/null || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge iproute2 util-linux)

clean-results:
	rm -rf results/data results/runs results/report results/logs results/*.parquet

# The GPU machine has Python 3.12 and torch with CUDA, no network, and of scalelab's runtime
# dependencies only those scalelab.harness.gpu_bundle.GPU_MACHINE_HAS names (numpy, pandas, ...).
# `make gpu-bundle` (here, with network) puts wheels of all the others, with their dependencies,
# in .whl/ (git-ignored, ~31 MB: carry it): the requirements that
# `python -m scalelab.harness.gpu_check --bundle-requirements` prints (pyproject.toml's runtime
# dependencies the machine lacks, and torchao for fp8), kept in .whl/requirements.txt.
# `make gpu-check` (there) installs them without network and runs python -m
# scalelab.harness.gpu_check within a 9-minute deadline (GPU tests; scalelab against a plain
# PyTorch loop; fp8 against bf16 at 350M and 1.3B; a reference sweep; the other precisions).
# GPU_CHECK_ARGS passes options, e.g. --only bench or --deadline-s 300.
GPU_PYTHON_VERSION ?= 3.12
GPU_PLATFORMS = --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
	--platform manylinux2014_x86_64 --platform manylinux1_x86_64
GPU_SITE ?= /tmp/scalelab-site

gpu-bundle: setup
	rm -rf .whl && mkdir -p .whl
	$(VENV)/bin/python -m scalelab.harness.gpu_check --bundle-requirements > .whl/requirements.txt
	# connection_pool (a Snakemake dependency) has no wheel on the index: build one
	$(VENV)/bin/pip wheel -q --no-deps connection_pool==0.0.3 -w .whl
	$(VENV)/bin/pip download -q --only-binary=:all: --python-version $(GPU_PYTHON_VERSION) --implementation cp \
		$(GPU_PLATFORMS) --find-links .whl -d .whl -r .whl/requirements.txt
	@du -sh .whl && ls .whl/*.whl | wc -l

gpu-check:
	python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $(GPU_SITE) .whl/*.whl
	PATH=$(GPU_SITE)/bin:$$PATH PYTHONPATH=$(GPU_SITE):$(CURDIR)/src PYTHONUNBUFFERED=1 \
		python3 -m scalelab.harness.gpu_check $(GPU_CHECK_ARGS)
