# The two commands that set everything up: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test check lint bench chaos clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[all,dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/flowbus run examples/stocks/flow.yaml --fresh

test: $(STAMP)
	command -v chromium >/dev/null || (apt-get update && apt-get install -y chromium)  # the console's browser tests
	test -f /usr/share/activemq/bin/activemq.jar || (apt-get update && apt-get install -y activemq)  # tests/bench
	$(BIN)/ruff check src tests
	$(BIN)/mypy
	$(BIN)/pytest -q -n 2 --dist loadgroup  # both cores; the Spark tests in one worker (tests/conftest.py)

check: $(STAMP)  # the fast loop: lint, types and the unit tests (no process, no socket, no JVM)
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests
	$(BIN)/mypy
	$(BIN)/pytest -q -n 2 -m unit --hypothesis-profile=check

lint: $(STAMP)
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests
	$(BIN)/mypy

bench: $(STAMP)
	test -f /usr/share/activemq/bin/activemq.jar || (apt-get update && apt-get install -y activemq)  # the baseline
	$(BIN)/flowbus bench match --workload w1 --subscriptions 100000 --json
	$(BIN)/flowbus bench match --workload w-rein --subscriptions 1000000 --events 2000 --json
	$(BIN)/flowbus bench broker --brokers 1,3 --subscriptions 10,1000,10000 --baseline activemq --json
	$(BIN)/flowbus bench broker --brokers 1,3 --subscriptions 10,1000,10000 --protocol stomp --baseline activemq --json  # one STOMP client program for both
	$(BIN)/flowbus bench floor --json
	$(BIN)/flowbus bench flow-bus --brokers 1,3 --events 100000 --subs 100 --json
	$(BIN)/flowbus bench flow-core --events 20000 --repeats 5 --json

chaos: $(STAMP)  # the full fault campaign (root: network namespaces; else faults of processes only)
	mkdir -p out/chaos
	$(BIN)/flowbus chaos run --overlay chordal-ring --seeds 5 --json --out out/chaos > out/chaos/chordal-ring.json
	$(BIN)/flowbus chaos run --overlay pastry-irbr --seeds 1 --json --out out/chaos > out/chaos/pastry-irbr.json
	$(BIN)/flowbus chaos sim --seeds 0-259 --jobs 2 --json --out out/chaos/sim > out/chaos/sim.json
	$(BIN)/flowbus chaos sim --timers broker --seeds 0-99 --events 6000 --jobs 2 --json --out out/chaos/sim-broker > out/chaos/sim-broker.json
	$(BIN)/flowbus chaos sim --timers broker --publishers 1,2 --seeds 0-99 --events 6000 --jobs 2 --json --out out/chaos/sim-wrap > out/chaos/sim-wrap.json
	$(BIN)/flowbus chaos sim --faults starve --derived --timers broker --seeds 0-199 --events 6000 --jobs 2 --json --out out/chaos/sim-starve > out/chaos/sim-starve.json
	$(BIN)/flowbus chaos sim --faults rejoin --derived --timers broker --seeds 0-99 --events 6000 --jobs 2 --json --out out/chaos/sim-rejoin > out/chaos/sim-rejoin.json

clean:
	rm -rf $(VENV) build dist src/*.egg-info .mypy_cache .ruff_cache .pytest_cache
