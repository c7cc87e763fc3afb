#!/usr/bin/env bash
# Set up spectune in ./.venv (idempotent): a CPU build of torch first, then the project and its
# test extras. On a machine that already has a CUDA torch (the GPU hosts), pass --system-torch to
# build the venv with --system-site-packages and keep that torch.
#
#   bash infra/setup.sh                # CPU machine / CI
#   bash infra/setup.sh --system-torch # GPU machine with torch preinstalled
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${SPECTUNE_VENV:-.venv}
PY=${PYTHON:-python3}
system_torch=0
[ "${1:-}" = "--system-torch" ] && system_torch=1

if [ ! -x "$VENV/bin/python" ]; then
  if [ $system_torch = 1 ]; then "$PY" -m venv --system-site-packages "$VENV"; else "$PY" -m venv "$VENV"; fi
fi
pip=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade pip >/dev/null 2>&1 || true
if ! "$VENV/bin/python" -c 'import torch' >/dev/null 2>&1; then
  # The pinned CPU build: a bare `torch` requirement would pull a multi-GB CUDA build.
  "${pip[@]}" install "torch==${SPECTUNE_TORCH_VERSION:-2.13.0}"
fi
"${pip[@]}" install -e '.[test]'
if [ $system_torch = 0 ] && [ "$(uname -sm)" = "Linux x86_64" ] && ! "$VENV/bin/python" -c 'import triton' >/dev/null 2>&1; then
  # Triton's CPU interpreter runs the GPU kernels' tests (tests/engine/test_kernels_*.py);
  # GPU hosts keep the Triton that came with their torch.
  "${pip[@]}" install "triton==${SPECTUNE_TRITON_VERSION:-3.6.0}"
fi
echo "spectune: environment ready in $VENV ($("$VENV/bin/python" -c 'import torch; print("torch", torch.__version__)'))"
