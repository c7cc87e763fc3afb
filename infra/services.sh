#!/usr/bin/env bash
# Local services for spectune, on loopback with free ports: a Ray head (with the job server),
# an MLflow tracking server (SQLite backend + artifact store) and optuna-dashboard.
# Each runs in its own process group; `stop` kills exactly those groups, nothing else on the machine,
# and removes the temporary directories `start` made (listed in STATE_DIR/tmpdirs).
#
#   bash infra/services.sh start [STATE_DIR]   # default STATE_DIR: ~/.spectune/services
#   source STATE_DIR/env                       # RAY_ADDRESS, MLFLOW_TRACKING_URI, SPECTUNE_STORAGE, URLs
#   bash infra/services.sh status [STATE_DIR]
#   bash infra/services.sh stop  [STATE_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
cmd=${1:-}
STATE=$(realpath -m "${2:-${SPECTUNE_HOME:-$HOME/.spectune}/services}")
BIN=${SPECTUNE_VENV:-$ROOT/.venv}/bin
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled}
export PATH="$BIN:$PATH"  # so `ray job submit -- spectune ...` finds this install

free_port() { "$BIN/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

wait_http() {  # url seconds name
  for _ in $(seq 1 "$2"); do
    if "$BIN/python" -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1], timeout=2)" "$1" >/dev/null 2>&1; then return 0; fi
    sleep 1
  done
  echo "spectune: $3 did not come up at $1 (log: $STATE/$3.log)" >&2
  return 1
}

start_group() {  # name cmd...  -> runs cmd in a new session (its own process group), records the PGID
  local name=$1; shift
  setsid "$@" >"$STATE/$name.log" 2>&1 < /dev/null &
  echo "$name $!" >> "$STATE/pids"
}

stop_all() {
  [ -f "$STATE/pids" ] || { echo "spectune: no services recorded in $STATE"; return 0; }
  while read -r name pgid; do
    if kill -0 -- "-$pgid" 2>/dev/null; then
      kill -TERM -- "-$pgid" 2>/dev/null || true
      for _ in $(seq 1 20); do kill -0 -- "-$pgid" 2>/dev/null || break; sleep 0.5; done
      kill -KILL -- "-$pgid" 2>/dev/null || true
      echo "spectune: stopped $name (process group $pgid)"
    fi
  done < "$STATE/pids"
  rm -f "$STATE/pids"
  if [ -f "$STATE/tmpdirs" ]; then
    while read -r dir; do
      case "$dir" in /tmp/spectune-*) rm -rf -- "$dir" && echo "spectune: removed $dir" ;; esac  # only what start made
    done < "$STATE/tmpdirs"
    rm -f "$STATE/tmpdirs"
  fi
}

case "$cmd" in
  start)
    mkdir -p "$STATE/mlartifacts"
    [ -f "$STATE/pids" ] && stop_all
    ray_port=$(free_port); dash_port=$(free_port); agent_port=$(free_port); mlflow_port=$(free_port); optuna_port=$(free_port)
    ray_tmp=$(mktemp -d /tmp/spectune-ray-XXXX)  # short: Ray's unix socket paths must stay < 108 bytes
    echo "$ray_tmp" >> "$STATE/tmpdirs"
    start_group ray "$BIN/ray" start --head --block --node-ip-address 127.0.0.1 --port "$ray_port" \
      --include-dashboard true --dashboard-host 127.0.0.1 --dashboard-port "$dash_port" \
      --dashboard-agent-listen-port "$agent_port" \
      --num-cpus "${SPECTUNE_RAY_CPUS:-$(nproc)}" --disable-usage-stats --temp-dir "$ray_tmp"
    start_group mlflow "$BIN/mlflow" server --host 127.0.0.1 --port "$mlflow_port" --workers 1 \
      --backend-store-uri "sqlite:///$STATE/mlflow.db" --artifacts-destination "$STATE/mlartifacts"
    "$BIN/python" -c "import optuna; optuna.storages.RDBStorage('sqlite:///$STATE/optuna.db')" >/dev/null
    start_group optuna-dashboard "$BIN/optuna-dashboard" "sqlite:///$STATE/optuna.db" --host 127.0.0.1 --port "$optuna_port"
    cat > "$STATE/env" <<ENV
export RAY_AUTH_MODE=$RAY_AUTH_MODE
export RAY_ADDRESS=http://127.0.0.1:$dash_port
export RAY_GCS_ADDRESS=127.0.0.1:$ray_port
export MLFLOW_TRACKING_URI=http://127.0.0.1:$mlflow_port
export SPECTUNE_STORAGE=sqlite:///$STATE/optuna.db
export OPTUNA_DASHBOARD_URL=http://127.0.0.1:$optuna_port
ENV
    wait_http "http://127.0.0.1:$dash_port/api/version" 120 ray
    # jobs are handed to the head node's dashboard agent: a submit before it listens is refused
    wait_http "http://127.0.0.1:$agent_port/api/local_raylet_healthz" 120 ray
    wait_http "http://127.0.0.1:$mlflow_port/health" 120 mlflow
    wait_http "http://127.0.0.1:$optuna_port/" 60 optuna-dashboard
    echo "spectune: services up (state in $STATE):"
    echo "  Ray jobs / dashboard  http://127.0.0.1:$dash_port"
    echo "  MLflow UI             http://127.0.0.1:$mlflow_port"
    echo "  optuna-dashboard      http://127.0.0.1:$optuna_port"
    echo "  source $STATE/env"
    ;;
  stop) stop_all ;;
  status)
    [ -f "$STATE/pids" ] || { echo "spectune: no services recorded in $STATE"; exit 1; }
    while read -r name pgid; do
      if kill -0 -- "-$pgid" 2>/dev/null; then echo "$name: running (process group $pgid)"; else echo "$name: not running"; fi
    done < "$STATE/pids"
    ;;
  *) echo "usage: $0 start|stop|status [STATE_DIR]" >&2; exit 2 ;;
esac
