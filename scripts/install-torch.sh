#!/bin/sh
# Install torch into the virtual environment of PYTHON (the Makefile's `run`, `test`, `install`).
#   a GPU here (nvidia-smi lists one):  the CUDA build, from the plain package index
#   no GPU:                             the CPU build, from PyTorch's CPU wheel index; where that
#                                       index cannot be reached, the plain package index
#   TORCH_INDEX=URL:                    that index, whatever the machine
# TORCH_SPEC (default torch==2.13.0) is the requirement. The choice is printed.
set -eu
PY=$1
SPEC=${TORCH_SPEC:-torch==2.13.0}
CPU_INDEX=https://download.pytorch.org/whl/cpu

if [ -n "${TORCH_INDEX:-}" ]; then
	echo "torch: $SPEC from TORCH_INDEX=$TORCH_INDEX"
	exec "$PY" -m pip install --quiet --index-url "$TORCH_INDEX" "$SPEC"
fi
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
	echo "torch: $SPEC, the CUDA build (a GPU is present), from the package index"
	exec "$PY" -m pip install --quiet "$SPEC"
fi
if "$PY" -c "import urllib.request as u; u.urlopen('$CPU_INDEX/torch/', timeout=10)" 2>/dev/null; then
	echo "torch: $SPEC, the CPU build (no GPU), from $CPU_INDEX"
	exec "$PY" -m pip install --quiet --index-url "$CPU_INDEX" "$SPEC"
fi
echo "torch: $SPEC from the package index: $CPU_INDEX cannot be reached (no GPU here; a stock"
echo "       index serves the multi-GB CUDA build: set TORCH_INDEX to a CPU wheel index to avoid it)"
exec "$PY" -m pip install --quiet "$SPEC"
