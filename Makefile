# Every target sets up .venv itself; a fresh clone needs only `make demo` / `make test`.
VENV    := .venv
PY      := $(VENV)/bin/python
PYTHON3 ?= python3
# 8 fake CPU devices for the sharding tests; must be set before JAX is imported.
export XLA_FLAGS ?= --xla_force_host_platform_device_count=8

.PHONY: venv demo test test-slow wheel-test lint docs docs-check bench bench-full bench-test bench-native rngtest clean

$(VENV)/.installed-dev: pyproject.toml
	test -x $(PY) || $(PYTHON3) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $@

$(VENV)/.installed-bench: $(VENV)/.installed-dev
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev,bench]'
	touch $@

$(VENV)/.installed-docs: $(VENV)/.installed-dev
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev,docs]'
	touch $@

venv: $(VENV)/.installed-dev

# Dropout rates 0-0.6, three seeds each, on few mislabelled digits: under a minute on 2
# cores. One device: the 8 fake CPU devices above would only add overhead here. The demo
# starts afresh each time (runs/demo is its scratch directory, which git ignores).
DEMO_FLAGS ?= --compare-rates 0,0.2,0.4,0.6 --num-seeds 3 --devices 1
demo: venv
	rm -rf runs/demo
	$(VENV)/bin/dropmask train digits --workdir runs/demo $(DEMO_FLAGS)

# The fast inner loop: everything but the tests marked slow (multi-process and training
# runs, the translate, seq2seq and SST-2 examples' whole models); prints the ten slowest
# tests. `make test-slow` runs the rest; CI runs both.
test: venv
	$(PY) -m pytest -q -n 2 -m "not slow" --durations=10 tests src/dropmask --doctest-modules

test-slow: venv
	$(PY) -m pytest -q -n 2 -m slow --durations=10 tests

# The built wheel in a fresh virtualenv outside the checkout trains and audits a user's
# example directory and the bundled digits (.ci/wheel_test; needs network to PyPI).
wheel-test:
	.ci/wheel_test

lint: venv
	$(PY) -m ruff format --check src tests examples benchmarks docs
	$(PY) -m ruff check src tests examples benchmarks docs
	$(PY) -m pyright

# The documentation site, docs/_build/html/index.html: the guides, the examples, the API
# reference from the docstrings, the command's flags, RESULTS.md and the changelog
# (docs/conf.py). Strict: any warning (a broken cross-reference, a public name without
# an entry, a docstring that does not render) fails it. About 25 s on 2 cores.
docs: $(VENV)/.installed-docs
	rm -rf docs/_build/html docs/_build/doctrees
	$(PY) -m sphinx -W --keep-going -n -q -b html -d docs/_build/doctrees docs docs/_build/html

# The built site in headless Chromium: the home page, dropmask.linen's API page and a
# search, failing on a console error or a missing element (docs/check_site.py);
# screenshots land in docs/_build/screenshots. Installs Debian's chromium and
# chromium-driver with apt-get where they are missing (as root, as CI runs).
docs-check: $(VENV)/.installed-docs
	test -f docs/_build/html/index.html || $(MAKE) docs
	@test -x /usr/bin/chromium -a -x /usr/bin/chromedriver || { \
	  test "$$(id -u)" = 0 || { echo "make docs-check needs Debian's chromium and chromium-driver: apt-get install chromium chromium-driver" >&2; exit 1; }; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium chromium-driver; }
	$(PY) docs/check_site.py docs/_build/html --screenshots docs/_build/screenshots

# Every speed and memory target in one table (benchmarks/targets.py; RESULTS.md's
# "targets" section): about 10 min on 2 cores, plus the long-sequence rows (Flax's
# causal step at 4096 tokens, about 6 GiB; dropmask's alone at 16384), longer under
# load. Exits 0 when a target fails (it is a report); BENCH_FLAGS=--strict makes a
# failure exit 1, --quick runs small sizes to check the suite.
bench: $(VENV)/.installed-bench
	XLA_FLAGS= $(PY) -m benchmarks.run $(BENCH_FLAGS)

# The full tables: dropout at every size and contestant, masking, the MLP train step.
# About 30 min on 2 cores. BENCH_FLAGS: --quick, --peak-gbps N (GPU bandwidth column).
bench-full: $(VENV)/.installed-bench
	XLA_FLAGS= $(PY) -m benchmarks.run --full $(BENCH_FLAGS)

# Tests of the benchmark helpers (benchmarks/tests); `make test` does not collect them.
# Under a minute; BENCH_TEST_FLAGS= also runs the whole target suite at a tiny size.
BENCH_TEST_FLAGS ?= -m "not slow"
bench-test: $(VENV)/.installed-dev
	$(PY) -m pytest -q -n 2 benchmarks/tests $(BENCH_TEST_FLAGS)

# Fused C dropout kernels timed beside XLA (benchmarks/bench_native.py): about 4 min on
# 2 cores; needs gcc and an x86-64 CPU with AVX2 and AES-NI. NATIVE_FLAGS: --repeats N.
bench-native: $(VENV)/.installed-dev
	XLA_FLAGS= $(PY) -m benchmarks.bench_native $(NATIVE_FLAGS)

# dieharder on dropmask's raw bit stream: about 5-6 min on 2 cores. Needs the dieharder
# program (Debian/Ubuntu: apt-get install dieharder; macOS: brew install dieharder).
# RNGTEST_FLAGS=--reference also runs the same battery on threefry (about 11 min).
rngtest: $(VENV)/.installed-dev
	@command -v dieharder >/dev/null || { echo "make rngtest needs the dieharder program: apt-get install dieharder (or brew install dieharder)" >&2; exit 1; }
	XLA_FLAGS= $(PY) -m benchmarks.rngtest $(RNGTEST_FLAGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
