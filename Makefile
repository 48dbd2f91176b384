# The two set-up commands (see README): `make demo` and `make test`. Both build .venv first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: demo test test-fast bench lint proto clean

$(STAMP): pyproject.toml
	@bash scripts/bootstrap.sh "$(PYTHON)" "$(VENV)"
	@rm -f $(VENV)/.installed-* && touch $(STAMP)

demo: $(STAMP)
	$(BIN)/qlayer demo

# The tests run in TEST_WORKERS processes at once (pytest-xdist): most of a test's time is
# waiting on brokers, leases and restarts, not CPU (one at a time, a run kept 0.37 of the two
# cores busy, in 40 minutes; 15 with three workers). TEST_WORKERS=0: one at a time, in order.
TEST_WORKERS ?= 3
test: $(STAMP)
	$(BIN)/python -m pytest tests -q -p no:cacheprovider --durations=25 -n $(TEST_WORKERS) --dist loadgroup

test-fast: $(STAMP)
	$(BIN)/python -m pytest tests/unit -q -p no:cacheprovider

# The long profile of the fault history run (minutes, not seconds).
.PHONY: soak
soak: $(STAMP)
	QLAYER_SOAK=1 $(BIN)/python -m pytest tests/fault/test_history.py tests/fault/test_cluster_history.py tests/fault/test_view_soak.py tests/fault/test_cluster_outage.py -q -p no:cacheprovider -s

# the whole benchmark (11-18 min; BENCH_ARGS=--quick: a few minutes); needs RabbitMQ, NATS, Redis up
bench: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[bench]'
	$(BIN)/python -m bench.run $(BENCH_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check layer connectors spark tests bench scripts
	$(BIN)/ruff format --check layer connectors spark tests bench scripts
	$(BIN)/mypy layer connectors bench

# the API's stubs from layer/api/proto/qlayer/v1/queue.proto (commit them with the .proto)
proto: $(STAMP)
	$(BIN)/python scripts/gen_proto.py

clean:
	rm -rf $(VENV) .qlayer
