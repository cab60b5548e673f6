# amqha — the two commands: `make run` and `make test`. Everything else is set up here.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
TOOLS  := $(VENV)/.build-tools
PINS   := $(VENV)/pinned.txt
# Test tools fetched by the set-up that no Debian package installs alone (tests/support.py).
RMQADMIN := build/tools/rabbitmqadmin
# Python may write its bytecode caches (__pycache__, ignored by git) whatever the shell
# says: with PYTHONDONTWRITEBYTECODE set, every server a test starts compiled amqha from
# source again (0.29 s of CPU a start instead of 0.15; the suite starts about 500).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: system setup compiled run test durations unit lint bench bench-federation compat demo report clean venv soak soak-backlog simulate partitions nemesis

venv: $(STAMP)

## The system's packages the suite uses, each installed from Debian only where missing.
## `make setup` fetches them beside the venv's install and the build.
system:
	@command -v java >/dev/null || { echo "installing a Java runtime for Spark"; \
		apt-get update -qq && apt-get install -y -qq default-jre-headless; }
	@command -v ss >/dev/null || { echo "installing iproute2 (ip, tc, ss) for the partition tests and the sockets' marks"; \
		apt-get install -y -qq iproute2 >/dev/null 2>&1 || \
		{ apt-get update -qq && apt-get install -y -qq iproute2; } || \
		echo "iproute2 not installed: make partitions and the marks' test will skip, saying why"; }
	@command -v nft >/dev/null || { echo "installing nftables for the partition tests"; \
		apt-get install -y -qq nftables >/dev/null 2>&1 || \
		{ apt-get update -qq && apt-get install -y -qq nftables; } || \
		echo "nftables not installed: make partitions will skip, saying why"; }
	@command -v chromium >/dev/null || { echo "installing chromium for the web page's browser test"; \
		apt-get install -y -qq chromium >/dev/null 2>&1 || \
		{ apt-get update -qq && apt-get install -y -qq chromium; } || \
		echo "chromium not installed: the web page's browser test will skip, saying why"; }
	@command -v fusermount3 >/dev/null || { echo "installing fuse3 for the power-loss and disk-fault tests"; \
		apt-get install -y -qq fuse3 >/dev/null 2>&1 || \
		{ apt-get update -qq && apt-get install -y -qq fuse3; } || \
		echo "fuse3 not installed: the power-loss and disk-fault tests will skip, saying why"; }
	@command -v promtool >/dev/null || { echo "installing prometheus's promtool for the alert rules' tests"; \
		apt-get install -y -qq --no-install-recommends prometheus >/dev/null 2>&1 || \
		{ apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus; } || \
		echo "promtool not installed: the alert rules' test will skip, saying why"; }
	@command -v faketime >/dev/null || { echo "installing faketime for the clock-step tests"; \
		apt-get install -y -qq faketime >/dev/null 2>&1 || \
		{ apt-get update -qq && apt-get install -y -qq faketime; } || \
		echo "faketime not installed: the clock-step test will skip, saying why"; }
	@command -v logrotate >/dev/null || { echo "installing logrotate for the shipped rotation rule's test"; \
		apt-get install -y -qq logrotate >/dev/null 2>&1 || \
		{ apt-get update -qq && apt-get install -y -qq logrotate; } || \
		echo "logrotate not installed: the rotation rule's test will skip, saying why"; }
	@command -v rabbitmqadmin >/dev/null || test -x $(RMQADMIN) || \
		{ echo "fetching rabbitmqadmin for the management API's tests (the one script, from Debian's rabbitmq-server package)"; \
		./tests/fetch_rabbitmqadmin $(RMQADMIN) || \
		echo "rabbitmqadmin not fetched: its two tests will skip, saying why"; }

## The venv. uv installs the same packages as pip, in 28 s against pip's 65 s on a fresh
## machine (it fetches and unpacks side by side). It first pins the whole resolution
## (pyproject.toml with the dev and speed extras) and installs, at those pins, what the
## hot path's build reads (mypy, pamqp, mypy_extensions, PyYAML's stubs): the build then
## runs while the rest installs. pip does it all, first, where uv cannot be had.
$(TOOLS): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@{ $(BIN)/python -m pip install --quiet uv && \
		$(BIN)/uv pip compile --quiet --extra dev --extra speed -o $(PINS) pyproject.toml && \
		$(BIN)/uv pip install --quiet --python $(BIN)/python -c $(PINS) \
			mypy mypy_extensions pamqp types-PyYAML; } || \
		{ echo "uv could not install the venv (said above): pip installs it instead"; \
		rm -f $(PINS); $(BIN)/python -m pip install --quiet -e '.[dev,speed]'; }
	@touch $(TOOLS)

## Where uv must revalidate what it fetched and cannot (a proxy that answers without its
## cache headers), it builds PySpark's sdist again at each install and keeps each build:
## about 2.4 GB of its cache per fresh clone here, until the disk was full. uv's prune
## drops the builds no entry points to any more (nothing else: 0.7 s).
$(STAMP): $(TOOLS)
	@test ! -f $(PINS) || $(BIN)/uv pip install --quiet --python $(BIN)/python -c $(PINS) \
		-e '.[dev,speed]' || { echo "uv could not install the rest (said above): pip does"; \
		$(BIN)/python -m pip install --quiet -e '.[dev,speed]'; }
	@test ! -f $(PINS) || $(BIN)/uv cache prune --quiet || true
	@touch $(STAMP)

## The hot modules compiled to C by mypyc into build/compiled (amqha/compiled.py); a no-op
## when that build matches the sources. Without a C compiler they run interpreted, as said.
compiled: $(TOOLS)
	@$(BIN)/python -c 'import sys, amqha.compiled as c; sys.exit(c.build())'

## Everything the commands below need: the system's packages fetched in the background,
## and the venv's packages installed, while the hot path is built (on a fresh machine one
## after the other they took 148 s; side by side, the build's 22 s and a few more).
setup: $(TOOLS)
	@$(MAKE) --no-print-directory system & system=$$!; \
		$(MAKE) --no-print-directory $(STAMP) & venv=$$!; \
		$(MAKE) --no-print-directory compiled; built=$$?; \
		wait $$venv && wait $$system && exit $$built

## Start the pair on loopback (primary :5672, backup :5673, or PORTS=P,B; the web pages at
## :15672 and :15673, or PAGE_PORTS=P,B; a taken port is
## replaced by a free one, and `amqha console` finds them in var/pair.json); Ctrl-C stops both.
run: setup
	$(BIN)/amqha pair --config-dir config $(if $(PORTS),--ports $(PORTS)) $(if $(PAGE_PORTS),--page-ports $(PAGE_PORTS))

## The whole suite: unit, integration (real processes on loopback), Spark. JOBS worker
## processes side by side (most tests wait on servers, not on the CPU; tests/xdist_groups.py
## says which tests share one); the 25 slowest tests are listed at the end.
JOBS ?= 5
test: setup
	$(BIN)/python -m pytest -q -p no:cacheprovider -n $(JOBS) --dist loadgroup --durations=25 \
		tests --ignore=tests/partitions

## Each test's time in a whole run, written to tests/durations.json: make test sends the
## longest work out first (tests/xdist_groups.py). Run it again when tests are added or grow.
durations: setup
	AMQHA_DURATIONS_OUT=tests/durations.json $(BIN)/python -m pytest -q -p no:cacheprovider \
		-n $(JOBS) --dist loadgroup tests --ignore=tests/partitions

## Real partitions: each server on a test host in a network namespace, faults made by the
## kernel (link down, nftables drops one way or at random). Needs root; skips, saying why,
## without it. CI runs it after make test.
partitions: setup
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/partitions

unit: setup
	$(BIN)/python -m pytest -q tests/unit

lint: $(STAMP)
	$(BIN)/ruff check amqha peering failover spark config tests bench
	$(BIN)/ruff format --check amqha peering failover spark config tests bench
	$(BIN)/lint-imports --no-cache
	$(BIN)/mypy failover/fsm.py failover/fsm_steps.py failover/values.py failover/peer_message.py failover/witness.py amqha/wire.py amqha/compiled.py amqha/connection.py amqha/channel.py amqha/channel_parts.py amqha/channel_publish.py amqha/channel_tx.py amqha/gate.py amqha/host.py amqha/store.py amqha/store_file.py amqha/store_write.py amqha/core amqha/federation amqha/memory_account.py amqha/held.py amqha/confirm_pipeline.py amqha/listener.py bench/nemesis_check.py bench/nemesis_plan.py

## The suite's kill loops at full size (the tests marked soak: 30 kill/restart cycles, 20
## kills under amqha.client, 20 kills under a raw publisher), then 100 kill -9s of the ACTIVE
## under a confirming publisher and an acking consumer; JSON.
soak: setup
	SOAK=1 $(BIN)/python -m pytest -q -p no:cacheprovider -m soak tests --ignore=tests/partitions
	$(BIN)/python -m bench.soak --kills 100

## The worst moments: a backlog of 300,000 messages and 100 kill -9s of the ACTIVE at random
## moments (while the restarted PASSIVE catches up, within 0.5 s of its in sync, later); JSON.
soak-backlog: setup
	$(BIN)/python -m bench.soak --kills 100 --backlog 300000

## A seeded fault schedule with a checker (Jepsen's way): 10 publishers and 10 consumers on a
## pair while kill -9, SIGSTOP/SIGCONT (0.1 s up to a quarter of DURATION, at most 120 s) and
## partitions (network namespaces: root; skipped, saying why, without) hit both servers for
## DURATION s; then heal, drain, check. One JSON line per run (lost, duplicated, unexpected,
## takeovers, dual-active and unavailable seconds, the schedule); SEED=N, random or 1,2,random;
## WITNESS=1 adds a witness. A failed run keeps its logs and stores and prints where.
DURATION ?= 600
SEED ?= random
nemesis: setup
	$(BIN)/python -m bench.nemesis --duration $(DURATION) --seed $(SEED) $(if $(WITNESS),--witness)

## The deterministic simulators: SCHEDULES seeded schedules of the replication protocol (kill
## -9, dropped links, slow or failing disks), then FREEZE_SCHEDULES of failover under freezes
## (the rule after a freeze, kills, link resets); JSON with the failing seeds and schedules/s.
SCHEDULES ?= 100000
FREEZE_SCHEDULES ?= 20000
simulate: setup
	$(BIN)/python -m tests.sim --schedules $(SCHEDULES) --jobs 2
	$(BIN)/python -m tests.sim --freezes --schedules $(FREEZE_SCHEDULES) --jobs 2

## Benchmarks side by side with RabbitMQ (installed from Debian if missing); prints JSON.
bench: setup
	$(BIN)/python -m bench.run

## Exchange federation beside RabbitMQ's federation plugin (two nodes of each): the rate
## through a federated exchange with confirms end to end, and a new binding's latency; JSON.
## Also part of make bench.
bench-federation: setup
	$(BIN)/python -m bench.federation_bench

## Real clients' own suites (kombu, pika, amqplib, aio-pika, a Celery worker) on amqha and on
## RabbitMQ, side by side. Downloads the suites (and installs RabbitMQ from Debian if
## missing): not in make test.
compat: setup
	$(BIN)/python -m bench.compat

## A scripted tour: start the pair, publish, kill -9 the primary, take over, recover.
demo: setup
	$(BIN)/python -m amqha.demo

clean:
	rm -rf $(VENV) var build *.egg-info .pytest_cache
