# The two commands of the README: `make run` and `make test`. Both create .venv when missing.
VENV   ?= .venv
PY     := $(VENV)/bin/python
CONFIG ?= etc/talaria.yaml
STAMP  := $(VENV)/.installed

.PHONY: run test proto bench clean

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
	$(PY) -m pytest -q

# Regenerate the admin API's Python modules after editing talariad/admin/admin.proto.
proto: $(STAMP)
	$(PY) -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. talariad/admin/admin.proto

clean:
	rm -rf $(VENV) run .pytest_cache .hypothesis
