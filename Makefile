# Every tool runs from the project venv, so a fresh clone needs nothing but
# python3 and make: `make test` builds the venv first.
VENV := .venv
BIN := $(VENV)/bin
SRC := metering workers tests bench conftest.py
PYTEST_ARGS ?=

.PHONY: venv bytecode servers lint asserts test test-thorough test-fast mutants demo bench fmt clean

venv: $(VENV)/.installed

# A stamp file, so the install reruns only when the dependencies change.
# No bytecode: compiling every module of every package took as long as the
# install, and the suite imports a fifth of them; `asserts` writes theirs
# beside lint. uv installs, pip where uv cannot be had (docs/testing.md).
$(VENV)/.installed: pyproject.toml
	bash scripts/venv.sh $(VENV) '.[dev,charts,tracing]'
	touch $@

# The package's bytecode, written even where PYTHONDONTWRITEBYTECODE is set:
# without it every command, worker and server the tests start compiles the
# package's modules again (about 0.5 s of CPU each). Quick when up to date.
bytecode: venv
	$(BIN)/python -m compileall -q metering workers

# Server binaries for the integration tests (installed only when missing).
servers:
	bash scripts/ensure-servers.sh

# lint-imports: the layers ([tool.importlinter] in pyproject.toml). vulture: dead code
# ([tool.vulture] in pyproject.toml, vulture_allowlist.py).
lint: venv
	$(BIN)/ruff check $(SRC)
	$(BIN)/ruff format --check $(SRC)
	$(BIN)/mypy metering workers
	$(BIN)/lint-imports
	$(BIN)/vulture

# Lint first: a style or type error fails fast, before the slower suite.
# Beside it (mypy leaves the second core idle), `asserts` collects the suite
# once, which leaves every test file's assert-rewritten bytecode in pytest's
# cache for the workers (about 13 s of CPU each otherwise: docs/testing.md).
# Three processes on two cores (tests wait on servers: docs/testing.md), a
# whole file to each at a time, longest file first (tests/durations.json;
# xdist's own order would put the few-test, minute-long files last), each
# with its own throw-away servers; a test still
# running after 15 minutes fails with its stack printed instead of hanging CI
# (docs/testing.md); the 30 slowest tests are listed at the end.
PARALLEL := -n 3 --dist loadfile --no-loadscope-reorder --timeout 900 --durations=30
test: bytecode servers
	$(MAKE) --no-print-directory -j2 lint asserts
	bash scripts/pytest.sh $(PARALLEL) $(PYTEST_ARGS)

# `make test` with the slow property tests' whole example budgets (twice
# theirs there; tests/budgets.py): after a change to the engine's paths, a
# model's storage or the API's schema.
test-thorough: bytecode servers
	$(MAKE) --no-print-directory -j2 lint asserts
	bash scripts/pytest.sh $(PARALLEL) --hypothesis-profile thorough $(PYTEST_ARGS)

# A cache only: a test file that does not import fails the run that follows.
# The collection also writes the bytecode of the dependencies the tests
# import, scripts/bytecode.py that of the processes they start.
asserts: venv
	-bash scripts/pytest.sh --collect-only -q -p no:cacheprovider > /dev/null
	-env -u PYTHONDONTWRITEBYTECODE $(BIN)/python scripts/bytecode.py

# The tests that need no server (no PostgreSQL, Redis, worker process or
# socket server): conftest.py marks the others `server` from the fixtures they
# use. No lint, no `servers`; three workers, as `make test` (docs/testing.md).
test-fast: bytecode
	bash scripts/pytest.sh $(PARALLEL) -m "not server" $(PYTEST_ARGS)

# Mutation testing of the domain against its unit tests (docs/testing.md):
# fails on a surviving mutant that tests/mutants-equivalent.txt does not explain.
mutants: venv
	$(BIN)/python scripts/mutants.py

demo: bytecode
	$(BIN)/metering demo

# Every speed target's benchmark in one run (minutes; an idle machine): docs/performance.md.
bench: venv servers
	bash scripts/bench.sh

fmt: venv
	$(BIN)/ruff format $(SRC)
	$(BIN)/ruff check --fix $(SRC)

# Keeps the venv: rebuilding it needs the network.
clean:
	rm -rf .pytest_cache .mypy_cache .ruff_cache build dist *.egg-info mutants
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +
