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

.PHONY: run test proto bench clean install unit

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	# Without a GPU, pin the CPU wheel: a plain `torch` requirement pulls a multi-GB CUDA build.
	if ! (command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1); then \
		$(PY) -m pip install --quiet torch==2.13.0; fi
	$(PY) -m pip install --quiet -e '.[engine,test]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/talariad run --config $(CONFIG)

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest -q

# Regenerate the admin API's Python modules after editing talariad/admin/admin.proto.
proto: $(STAMP)
	$(PY) -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. talariad/admin/admin.proto

# The unit with ExecStart under PREFIX.
unit:
	install -d $(DESTDIR)$(UNITDIR)
	sed 's#/opt/talaria#$(PREFIX)#g' systemd/talariad.service > $(DESTDIR)$(UNITDIR)/talariad.service

install: unit
	test -x $(PREFIX)/bin/python || python3 -m venv $(PREFIX)
	if [ "$(EXTRAS)" = engine ] && ! (command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1); then \
		$(PREFIX)/bin/pip install --quiet torch==2.13.0; fi
	$(PREFIX)/bin/pip install --quiet '.$(if $(EXTRAS),[$(EXTRAS)])'
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
