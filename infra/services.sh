#!/usr/bin/env bash
# Local services for spectune: PostgreSQL (the Optuna storage and the MLflow server's store), a Ray head
# (with the job server) and, on request, worker raylets on this machine, an MLflow tracking server
# (artifacts in STATE_DIR) and optuna-dashboard. Every listener is on 127.0.0.1 at a free port, unless
# SPECTUNE_BIND_ADDRESS names this machine's address for other Ray nodes: then Ray's node ports use it
# (Ray listens on every interface for them); PostgreSQL, MLflow, the dashboards and the job server stay
# on 127.0.0.1 (drivers run on this head node; UIs via `ssh -L`).
# Every service asks for credentials, on loopback too (loopback is every local user of the machine):
# Ray's token authentication, MLflow's basic-auth app, optuna-dashboard behind the same user and
# password as MLflow, PostgreSQL's password. The secrets are made once, kept in mode-600 files of
# STATE_DIR and never put on a command line (which every local user can read).
# Each service runs in its own process group; `stop` ends exactly those groups, nothing else on the
# machine, and removes the temporary directories `start` made (listed in STATE_DIR/tmpdirs). The
# studies stay (PostgreSQL's data, MLflow's artifacts) for the next `start`; `purge` deletes them.
#
#   bash infra/services.sh start  [STATE_DIR]   # default STATE_DIR: ${SPECTUNE_HOME:-~/.spectune}/services
#   source STATE_DIR/env                        # the addresses and credentials below
#   ray job submit --working-dir . -- spectune run experiments/smoke-cpu.yaml --set "study.storage=$SPECTUNE_STORAGE"
#   bash infra/services.sh status [STATE_DIR]
#   bash infra/services.sh stop   [STATE_DIR]
#   bash infra/services.sh purge  [STATE_DIR]   # stop, then delete the PostgreSQL data, artifacts and state files
#
# Settings (the environment of `start`):
#   SPECTUNE_RAY_CPUS         CPUs of the Ray head (default: nproc)
#   SPECTUNE_RAY_WORKERS      worker raylets started beside the head (default 0): a real multi-node Ray
#                             cluster on one machine (study.isolation: node still runs one trial at a time
#                             on it: its nodes share one host)
#   SPECTUNE_RAY_HOST_LABELS  1: label the head and each worker raylet as a host of its own (the Ray label
#                             spectune.io/host), so that isolation node places a trial on each; for testing
#                             the scheduler on one machine: those trials' timings disturb each other
#   SPECTUNE_RAY_WORKER_CPUS  CPUs of each worker raylet (default: SPECTUNE_RAY_CPUS, else nproc)
#   SPECTUNE_BIND_ADDRESS     this machine's cluster address (default 127.0.0.1: nothing leaves loopback)
#   SPECTUNE_VENV             the virtual environment (default: .venv of this checkout)
# RAY_AUTH_MODE is always `token` (any other value is refused): Ray runs every job as the user who
# started it, so an open job server or GCS would run anyone's code as that user.
#
# STATE_DIR holds, each mode 600 and made once (kept by `stop`, deleted by `purge`):
#   env               the exports below
#   ray-token         Ray's token (Ray >= 2.52)
#   mlflow-auth.ini   the MLflow basic-auth app's configuration: admin user `spectune`, its generated password
#                     (never MLflow's default), the user store in PostgreSQL's database mlflow_auth,
#                     NO_PERMISSIONS for any other user made later
#   pgpass            PostgreSQL's password (libpq's password file)
#
# STATE_DIR/env exports, for `ray job submit`, drivers and clients on this machine:
#   RAY_ADDRESS               http://127.0.0.1:PORT, Ray's job server and dashboard (`ray job submit` reads it)
#   RAY_GCS_ADDRESS           HOST:PORT of the GCS (`ray start --address` of another node, `ray.init`)
#   RAY_AUTH_MODE             token
#   RAY_AUTH_TOKEN_PATH       STATE_DIR/ray-token: `ray job submit`, drivers and other nodes present it (the file
#                             also opens the Ray dashboard in a browser); the env file unsets RAY_AUTH_TOKEN,
#                             which Ray would prefer to it
#   MLFLOW_TRACKING_URI       http://127.0.0.1:PORT, the MLflow server (tracking.uri defaults to it)
#   MLFLOW_TRACKING_USERNAME  spectune
#   MLFLOW_TRACKING_PASSWORD  its password (the MLflow client and spectune send both; the MLflow UI and
#                             optuna-dashboard ask for them in the browser)
#   SPECTUNE_STORAGE          postgresql+psycopg://spectune@127.0.0.1:PORT/optuna?passfile=STATE_DIR/pgpass, for
#                             study.storage: it names the password file (libpq's passfile), not the password
#   PGHOST PGPORT PGUSER PGPASSFILE   libpq's own: `psql -d optuna` (or mlflow) just works; PGPASSFILE is
#                             STATE_DIR/pgpass, the one place the generated password is kept
#   OPTUNA_DASHBOARD_URL      http://127.0.0.1:PORT
# The Ray processes start with the Ray and MLflow variables, SPECTUNE_STORAGE and PGPASSFILE in their
# environment (readable by their user only), so a job's driver reaches both stores; no password or token
# is ever on a command line or in a URL.
#
# PostgreSQL comes from the distribution (`apt-get install postgresql` here when root and it is missing);
# as root it runs as the user `postgres` (it refuses root), with its data in STATE_DIR/pg, or, where that
# user cannot reach STATE_DIR (a folder above it closed to others, like /root), in
# /var/lib/spectune/pg-<hash of STATE_DIR>, which STATE_DIR/pg then links to.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
cmd=${1:-}
STATE=$(realpath -m "${2:-${SPECTUNE_HOME:-$HOME/.spectune}/services}")
BIN=${SPECTUNE_VENV:-$ROOT/.venv}/bin
export PATH="$BIN:$PATH"  # so `ray job submit -- spectune ...` finds this install

BIND=${SPECTUNE_BIND_ADDRESS:-127.0.0.1}
case "$BIND" in 127.0.0.1 | localhost | ::1) LOOPBACK=1; NODE_IP=127.0.0.1 ;; *) LOOPBACK=0; NODE_IP=$BIND ;; esac

die() { echo "spectune: $*" >&2; exit 1; }

free_port() { "$BIN/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# service -> a free port, recorded in STATE/ports: between this pick and the service's bind another
# process may be given the same port, which infra/ports_taken.py then finds (start tries again)
pick_port() {  # (always inside $(...), where errexit is off: each failure returns by hand)
  local port
  for _ in 1 2 3; do
    port=$(free_port) || return 1
    [[ $port =~ ^[0-9]+$ ]] || return 1
    # two picks may return one port: a second service on it would not be a stranger to the check
    grep -q " $port\$" "$STATE/ports" 2>/dev/null || { echo "$1 $port" >> "$STATE/ports"; echo "$port"; return 0; }
  done
  return 1
}
PORT_TAKEN=75  # infra/ports_taken.py's exit status when a picked port is held by another process

secret() { "$BIN/python" -c 'import secrets, sys; print(secrets.token_hex(int(sys.argv[1])))' "$1"; }  # N bytes, in hex

# url name [timeout]: an HTTP GET that succeeds, with the service's credentials: Ray's servers (name ray*)
# are sent Ray's token (read from its file), MLflow and optuna-dashboard the MLflow user and password
HTTP_OK='import base64, os, sys, urllib.request
url, name, timeout = sys.argv[1], sys.argv[2], float((sys.argv[3:] or [2])[0])
if name.startswith("ray"):
    auth = "Bearer " + open(os.environ["RAY_AUTH_TOKEN_PATH"]).read().strip()
else:
    user = os.environ["MLFLOW_TRACKING_USERNAME"] + ":" + os.environ["MLFLOW_TRACKING_PASSWORD"]
    auth = "Basic " + base64.b64encode(user.encode()).decode()
urllib.request.urlopen(urllib.request.Request(url, headers={"Authorization": auth}), timeout=timeout)'

wait_http() {  # url seconds name: up -> 0; the service's process gone or the time up -> the log's tail, exit 1
  local pid why
  pid=$(awk -v n="$3" '$1 == n {p = $2} END {print p}' "$STATE/pids" 2>/dev/null)
  for _ in $(seq 1 "$2"); do
    if "$BIN/python" -c "$HTTP_OK" "$1" "$3" >/dev/null 2>&1; then return 0; fi
    if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then why=2; break; fi
    sleep 1
  done
  if [ "${why:-1}" = 2 ]; then echo "spectune: $3 exited before it answered at $1; the end of $STATE/$3.log:" >&2
  else echo "spectune: $3 did not come up at $1 within $2 tries; the end of $STATE/$3.log:" >&2; fi
  tail -n 15 "$STATE/$3.log" 2>/dev/null | sed 's/^/  | /' >&2
  die "$3 did not come up at $1 (log: $STATE/$3.log)"
}

write_env() {  # NAME=value... -> STATE/env (mode 600): one `export NAME=value` a line, shell-quoted only where needed
  local kv value
  (umask 077 && {
    echo "unset RAY_AUTH_TOKEN  # Ray prefers a token in the environment to RAY_AUTH_TOKEN_PATH's"
    for kv in "$@"; do
      value=${kv#*=}
      if [[ $value =~ ^[A-Za-z0-9_./:@+%?=,-]*$ ]]; then echo "export ${kv%%=*}=$value"; else printf 'export %s=%q\n' "${kv%%=*}" "$value"; fi
    done
  } > "$STATE/env")
}

keep_logs() {  # try: each started service's log (and its Ray session's) renamed to NAME.tryN.log before the next try
  local name pgid dir agent_log
  while read -r name pgid; do
    if [ -f "$STATE/$name.log" ]; then mv "$STATE/$name.log" "$STATE/$name.try$1.log"; fi
  done < "$STATE/pids"
  if [ -f "$STATE/tmpdirs" ]; then  # the Ray temp folders go with stop: their agents' logs first
    while read -r dir; do
      agent_log=$dir/session_latest/logs/dashboard_agent.log
      if [ -f "$agent_log" ]; then cp "$agent_log" "$STATE/$(basename "$dir").dashboard_agent.try$1.log"; fi
    done < "$STATE/tmpdirs"
  fi
}

start_group() {  # name cmd...  -> runs cmd in a new session (its own process group), records the PGID
  local name=$1; shift
  setsid "$@" >"$STATE/$name.log" 2>&1 < /dev/null &
  echo "$name $!" >> "$STATE/pids"
}

# ------------------------------------------------------------------ PostgreSQL
pg_bin() {  # the folder of initdb, postgres, psql and pg_isready: initdb's on PATH, else Debian's newest
  local d                                # /usr/lib/postgresql/<version>/bin
  for d in $(command -v initdb >/dev/null && dirname "$(readlink -f "$(command -v initdb)")") \
    $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    [ -x "$d/initdb" ] && [ -x "$d/postgres" ] && [ -x "$d/psql" ] && [ -x "$d/pg_isready" ] && { echo "$d"; return 0; }
  done
  return 1
}

ensure_postgres() {  # sets PGBIN; installs the distribution's package when root with apt-get
  PGBIN=$(pg_bin) && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "spectune: installing PostgreSQL (apt-get install -y postgresql; log: $STATE/apt.log)"
    # no system-wide cluster listening on 5432: spectune runs its own
    mkdir -p /etc/postgresql-common/createcluster.d
    echo "create_main_cluster = false" > /etc/postgresql-common/createcluster.d/spectune.conf
    { DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql ||
      { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql; }; } >"$STATE/apt.log" 2>&1 ||
      die "apt-get install postgresql failed (log: $STATE/apt.log)"
    PGBIN=$(pg_bin) && return 0
  fi
  die "PostgreSQL's server (initdb, postgres) is not installed: install it (Debian/Ubuntu: apt-get install postgresql; Fedora: dnf install postgresql-server) or put its bin folder on PATH"
}

pg_user_setup() {  # AS_PG: how to run a command as the user PostgreSQL runs as; PGDATA: its data directory
  AS_PG=()
  if [ "$(id -u)" = 0 ]; then
    id -u postgres >/dev/null 2>&1 ||
      die "PostgreSQL refuses to run as root and there is no user 'postgres' to run it as: create one (useradd --system postgres) or start the services as another user"
    AS_PG=(setpriv --reuid=postgres --regid=postgres --init-groups --)
  fi
  if [ -L "$STATE/pg" ]; then
    PGDATA=$(readlink -f "$STATE/pg")
  elif [ ${#AS_PG[@]} -eq 0 ] || "${AS_PG[@]}" test -x "$STATE"; then
    PGDATA=$STATE/pg
  else
    PGDATA=/var/lib/spectune/pg-$(printf '%s' "$STATE" | sha256sum | cut -c1-12)
    mkdir -p /var/lib/spectune && chmod 755 /var/lib/spectune
    ln -sfn "$PGDATA" "$STATE/pg"
    echo "spectune: user postgres cannot reach $STATE (a folder above it is closed to others): PostgreSQL data in $PGDATA"
  fi
  mkdir -p "$PGDATA" && chmod 700 "$PGDATA"
  [ ${#AS_PG[@]} -eq 0 ] || chown postgres: "$PGDATA"
}

pg_init() {  # a new cluster in PGDATA (once), superuser `spectune` with the password of STATE/pgpass
  if [ ! -s "$STATE/pgpass" ]; then
    [ -f "$PGDATA/PG_VERSION" ] && die "$PGDATA holds a PostgreSQL cluster but its password file $STATE/pgpass is gone: purge to start afresh"
    local pw
    pw=$(secret 24)
    (umask 077 && printf '*:*:*:spectune:%s\n' "$pw" > "$STATE/pgpass")  # printf is a builtin: on no command line
  fi
  chmod 600 "$STATE/pgpass"
  [ -f "$PGDATA/PG_VERSION" ] && return 0
  local pwfile
  pwfile=$(mktemp "${TMPDIR:-/tmp}/spectune-pgpw-XXXXXX")  # initdb runs as postgres: a copy it can read, gone at once
  cut -d: -f5 "$STATE/pgpass" > "$pwfile"
  [ ${#AS_PG[@]} -eq 0 ] || chown postgres: "$pwfile"
  if ! env -C / "${AS_PG[@]}" "$PGBIN/initdb" -D "$PGDATA" -U spectune --pwfile="$pwfile" -A scram-sha-256 -E UTF8 --no-locale \
    >"$STATE/initdb.log" 2>&1; then
    rm -f "$pwfile"
    die "initdb failed (log: $STATE/initdb.log)"
  fi
  rm -f "$pwfile"
}

pg_sql() {  # sql [db] -> rows, unaligned
  "$PGBIN/psql" -h 127.0.0.1 -p "$pg_port" -U spectune -d "${2:-postgres}" -v ON_ERROR_STOP=1 -tAqc "$1"
}

pg_databases() {  # wait for the server, then make the databases: Optuna's, MLflow's, MLflow's users
  for _ in $(seq 1 60); do
    "$PGBIN/pg_isready" -q -h 127.0.0.1 -p "$pg_port" -d postgres && break
    group_alive "$1" || die "PostgreSQL did not start (log: $STATE/postgres.log)"
    sleep 0.5
  done
  "$PGBIN/pg_isready" -q -h 127.0.0.1 -p "$pg_port" -d postgres || die "PostgreSQL did not come up on 127.0.0.1:$pg_port (log: $STATE/postgres.log)"
  if [ -f "$STATE/mlflow-auth.new" ] && [ "$(pg_sql "SELECT 1 FROM pg_database WHERE datname = 'mlflow_auth'")" = 1 ]; then
    pg_sql "DROP DATABASE mlflow_auth" >/dev/null  # its admin's password went with the file: nobody could log in
    echo "spectune: $STATE/mlflow-auth.ini was gone: MLflow's users (database mlflow_auth) made afresh with a new password (users made in MLflow before are gone; runs stay)" >&2
  fi
  for db in optuna mlflow mlflow_auth; do
    [ "$(pg_sql "SELECT 1 FROM pg_database WHERE datname = '$db'")" = 1 ] || pg_sql "CREATE DATABASE $db" >/dev/null
  done
  rm -f "$STATE/mlflow-auth.new"  # the user store now starts from the password of mlflow-auth.ini
}

# ------------------------------------------------------------------ Ray
# Ray turns a node address of 127.0.0.1 into the machine's outside address (and its GCS, raylets and
# agents then listen on every interface) unless RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, with which `ray
# start` refuses to start a worker node. On loopback the nodes start with that variable (their GCS,
# raylet, agents and workers inherit it: every listener on 127.0.0.1) through this `ray` that keeps
# the node address as given.
RAY_CLI_LOOPBACK='import sys
from ray._private import ray_constants, services
ray_constants.ENABLE_RAY_CLUSTER = True
services.resolve_ip_for_localhost = lambda host: host
from ray.scripts.scripts import main
sys.argv[0] = "ray"
sys.exit(main())'

ray_cli() {  # -> RAY_CLI: the `ray` command line that starts a node
  if [ "$LOOPBACK" = 1 ]; then
    RAY_CLI=(env RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 "$BIN/python" -c "$RAY_CLI_LOOPBACK")
  else
    RAY_CLI=("$BIN/ray")
  fi
}

ray_auth() {  # RAY_AUTH_MODE=token and its token file for every Ray process, `ray job submit` and drivers
  [ "${RAY_AUTH_MODE:-token}" = token ] ||
    { echo "spectune: RAY_AUTH_MODE=$RAY_AUTH_MODE: the services' Ray always asks for its token (Ray runs any job it is handed as $(id -un), and every local user reaches 127.0.0.1); unset RAY_AUTH_MODE" >&2; exit 2; }
  "$BIN/python" -c 'import sys, ray; sys.exit(tuple(map(int, ray.__version__.split(".")[:2])) < (2, 52))' ||
    die "Ray $("$BIN/python" -c 'import ray; print(ray.__version__)') has no token authentication (Ray >= 2.52 has): upgrade ray in $BIN/.."
  export RAY_AUTH_MODE=token
  unset RAY_AUTH_TOKEN  # only ever this state's own token, from its file
  if [ ! -s "$STATE/ray-token" ]; then
    local token
    token=$(secret 32)
    (umask 077 && printf '%s\n' "$token" > "$STATE/ray-token")  # printf is a builtin: on no command line
  fi
  chmod 600 "$STATE/ray-token"
  export RAY_AUTH_TOKEN_PATH=$STATE/ray-token
}

# ------------------------------------------------------------------ MLflow's basic-auth app
mlflow_auth() {  # store_uri -> STATE/mlflow-auth.ini (mode 600; the admin password made once, kept across
  # starts, the user store's address written anew: its port changes); MLFLOW_TRACKING_USERNAME/PASSWORD
  # exported for the clients started here. A password made here is marked by STATE/mlflow-auth.new until
  # pg_databases has made the user store afresh for it (a start that fails before, or a try started
  # again, still knows the store holds another admin password)
  local pw=""
  [ -f "$STATE/mlflow-auth.ini" ] && pw=$(sed -n 's/^admin_password = //p' "$STATE/mlflow-auth.ini")
  [ -n "$pw" ] || { pw=$(secret 24); (umask 077 && : > "$STATE/mlflow-auth.new"); }
  (umask 077 && printf '%s\n' "[mlflow]" "default_permission = NO_PERMISSIONS" "database_uri = ${1//'%'/%%}" \
    "admin_username = spectune" "admin_password = $pw" \
    "authorization_function = mlflow.server.auth:authenticate_request_basic_auth" \
    "# a password's hash check costs ~0.25 s of CPU: remember a good one (one worker: a change applies at once)" \
    "auth_cache_ttl_seconds = 300" > "$STATE/mlflow-auth.ini")
  chmod 600 "$STATE/mlflow-auth.ini"
  export MLFLOW_TRACKING_USERNAME=spectune MLFLOW_TRACKING_PASSWORD=$pw
  # the server takes its admin from this file alone (these would override it)
  unset MLFLOW_AUTH_ADMIN_USERNAME MLFLOW_AUTH_ADMIN_PASSWORD MLFLOW_AUTH_CONFIG_PATH
}

# ------------------------------------------------------------------ stop, status, purge
group_alive() {  # pgid: a member that is not a zombie (an exited process whose parent has not reaped it yet)
  ps -e -o pgid=,stat= | awk -v g="$1" '$1 == g && $2 !~ /^Z/ {found = 1} END {exit !found}'
}

signal_for() { [ "$1" = postgres ] && echo INT || echo TERM; }  # postgres: fast shutdown (ends open sessions)

grace_ticks() {  # quarter seconds a group has between its signal and SIGKILL; Ray's GCS, autoscaler and
  # agents linger over SIGTERM and nothing of Ray's needs to outlive it: 5 s; the rest 10 s
  case "$1" in ray*) echo 20 ;; *) echo 40 ;; esac
}

stop_all() {
  [ -f "$STATE/pids" ] || { echo "spectune: no services recorded in $STATE"; return 0; }
  local -a names=() pgids=()
  local name pgid i tick alive
  while read -r name pgid; do  # in reverse: workers before the head, clients before PostgreSQL
    group_alive "$pgid" || continue
    kill "-$(signal_for "$name")" -- "-$pgid" 2>/dev/null || true
    names+=("$name") pgids+=("$pgid")
  done < <(tac "$STATE/pids")
  for tick in $(seq 1 40); do  # all of them at once
    alive=0
    for i in "${!pgids[@]}"; do
      group_alive "${pgids[$i]}" || continue
      if [ "$tick" -ge "$(grace_ticks "${names[$i]}")" ]; then kill -KILL -- "-${pgids[$i]}" 2>/dev/null || true; else alive=1; fi
    done
    [ "$alive" = 0 ] && break
    sleep 0.25
  done
  for i in "${!pgids[@]}"; do
    ! group_alive "${pgids[$i]}" || kill -KILL -- "-${pgids[$i]}" 2>/dev/null || true
    echo "spectune: stopped ${names[$i]} (process group ${pgids[$i]})"
  done
  rm -f "$STATE/pids" "$STATE/ports"
  if [ -f "$STATE/tmpdirs" ]; then
    while read -r dir; do
      case "$dir" in /tmp/spectune-*) rm -rf -- "$dir" && echo "spectune: removed $dir" ;; esac  # only what start made
    done < "$STATE/tmpdirs"
    rm -f "$STATE/tmpdirs"
  fi
}

purge() {  # stop, then delete exactly what start made: the PostgreSQL data, artifacts, secrets, logs
  stop_all
  if [ -L "$STATE/pg" ]; then
    local data
    data=$(readlink -f "$STATE/pg")
    case "$data" in /var/lib/spectune/pg-*) rm -rf -- "$data" && echo "spectune: removed $data" ;; esac
    rm -f "$STATE/pg"
  elif [ -d "$STATE/pg" ]; then
    rm -rf -- "$STATE/pg" && echo "spectune: removed $STATE/pg"
  fi
  rm -rf -- "$STATE/mlartifacts"
  rm -f -- "$STATE"/{env,pgpass,ray-token,mlflow-auth.ini,mlflow-auth.new,apt.log,initdb.log,postgres.log,ray.log,mlflow.log,optuna-dashboard.log} \
    "$STATE"/ray-worker-*.log "$STATE"/*.try[0-9].log "$STATE"/*.dashboard_agent.log
  rmdir "$STATE" 2>/dev/null || true
  echo "spectune: purged $STATE"
}

start_ray_head() {  # sets ray_port dash_port client_port ray_tmp (launch()'s locals) and starts the head
  ray_port=$(pick_port ray); dash_port=$(pick_port ray); client_port=$(pick_port ray)
  ray_tmp=$(mktemp -d /tmp/spectune-ray-XXXX)  # short: Ray's unix socket paths must stay < 108 bytes
  echo "$ray_tmp" >> "$STATE/tmpdirs"
  # the autoscaler's and dashboard's metrics servers take fixed ports unless given others; the dashboard
  # agent binds a port of its own choosing (0) and writes it to a file (agent_port)
  start_group ray env AUTOSCALER_METRIC_PORT="$(pick_port ray)" DASHBOARD_METRIC_PORT="$(pick_port ray)" \
    "${RAY_CLI[@]}" start --head --block --node-ip-address "$NODE_IP" --port "$ray_port" \
    --ray-client-server-port "$client_port" --include-dashboard true --dashboard-host 127.0.0.1 --dashboard-port "$dash_port" \
    --dashboard-agent-listen-port 0 --num-cpus "$head_cpus" --disable-usage-stats --temp-dir "$ray_tmp" \
    $(host_label head)
}

agent_port() {  # ray_tmp name -> the port the node's dashboard agent listens on (Ray writes it to its session folder)
  local port="" files log
  for _ in $(seq 1 120); do
    files=("$1"/session_latest/dashboard_agent_listen_port_*)
    [ -f "${files[0]}" ] && port=$(cat "${files[0]}")
    [[ $port =~ ^-?[0-9]+$ ]] && break
    group_alive "$(awk -v n="$2" '$1 == n {p = $2} END {print p}' "$STATE/pids")" ||
      die "$2 exited before its dashboard agent listened (log: $STATE/$2.log)"
    sleep 1
  done
  [[ $port =~ ^[0-9]+$ ]] && { echo "$port"; return 0; }
  # the Ray temp folder goes when start stops what it started: the agent's log is kept beside the others
  log=$STATE/$2.dashboard_agent.log
  cp "$1/session_latest/logs/dashboard_agent.log" "$log" 2>/dev/null || log="(none written)"
  if [ -z "$port" ]; then
    die "the dashboard agent of $2 wrote no port within 120 s (its log: $log)"
  fi
  die "the dashboard agent of $2 serves no HTTP, so Ray jobs cannot start there (its log: $log)"
}

host_label() {  # the `ray start` flag naming raylet $1 a host of its own, where SPECTUNE_RAY_HOST_LABELS=1
  if [ "${SPECTUNE_RAY_HOST_LABELS:-0}" = 1 ]; then echo "--labels spectune.io/host=services-$1"; fi
}

# ------------------------------------------------------------------ start
start() {
  mkdir -p "$STATE/mlartifacts"
  [ -f "$STATE/pids" ] && stop_all
  trap 'echo "spectune: start failed: stopping what it started (logs stay in $STATE)" >&2; stop_all >&2' EXIT
  ray_auth  # first: a refused RAY_AUTH_MODE starts nothing
  ensure_postgres
  pg_user_setup
  umask 077  # from here on every file start makes (logs, MLflow's artifacts, secrets) is its user's alone
  chmod 700 "$STATE/mlartifacts"
  pg_init
  ray_cli
  # a port another process was given between pick_port and the service's bind (infra/ports_taken.py
  # names it): everything stops and starts again on fresh ports, three tries in all
  local try status
  for try in 1 2 3; do
    rm -f "$STATE/ports"
    set +e
    (set -e; launch)
    status=$?
    set -e
    [ "$status" = 0 ] && break
    if [ "$status" != "$PORT_TAKEN" ]; then  # a failure of its own unless the check finds a port taken
      "$BIN/python" "$ROOT/infra/ports_taken.py" "$STATE" || status=$?
      [ "$status" = "$PORT_TAKEN" ] || exit "$status"
    fi
    [ "$try" = 3 ] && die "three starts in a row lost a port to another process on this machine; start again when it is quieter"
    echo "spectune: starting again on fresh ports (try $((try + 1)) of 3; this try's logs: $STATE/*.try$try.log)" >&2
    keep_logs "$try"
    stop_all >/dev/null
  done
  trap - EXIT
}

check_ports() {  # a stranger on a picked port may have answered the checks so far in a service's place:
  # exit PORT_TAKEN (start tries again); a failure of the check itself stands
  "$BIN/python" "$ROOT/infra/ports_taken.py" "$STATE" && return 0
  local rc=$?
  [ "$rc" = "$PORT_TAKEN" ] || die "infra/ports_taken.py failed (exit $rc)"
  exit "$rc"
}

launch() {  # one try of start: picks the ports, starts every service, waits until each answers
  local workers=${SPECTUNE_RAY_WORKERS:-0} head_cpus=${SPECTUNE_RAY_CPUS:-$(nproc)}
  local worker_cpus=${SPECTUNE_RAY_WORKER_CPUS:-$head_cpus}
  local ray_port dash_port client_port ray_tmp mlflow_port optuna_port
  mlflow_port=$(pick_port mlflow); optuna_port=$(pick_port optuna-dashboard); pg_port=$(pick_port postgres)
  export PGHOST=127.0.0.1 PGPORT=$pg_port PGUSER=spectune PGPASSFILE=$STATE/pgpass
  export MLFLOW_TRACKING_URI=http://127.0.0.1:$mlflow_port
  # the URLs name the password file, not the password (libpq's `passfile`): fit for any command line
  local passfile mlflow_store
  passfile=$("$BIN/python" -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1], safe="/"))' "$PGPASSFILE")
  export SPECTUNE_STORAGE=postgresql+psycopg://spectune@127.0.0.1:$pg_port/optuna?passfile=$passfile
  mlflow_store=postgresql+psycopg://spectune@127.0.0.1:$pg_port/mlflow?passfile=$passfile
  mlflow_auth "postgresql+psycopg://spectune@127.0.0.1:$pg_port/mlflow_auth?passfile=$passfile"

  # the stores and their UIs first, bound before Ray's processes pick their own ports (by binding port 0,
  # which could hand them one of these) and checked before Ray starts: a try that must start again
  # then costs seconds, not a Ray cluster
  start_group postgres env -C / -u MLFLOW_TRACKING_PASSWORD "${AS_PG[@]}" "$PGBIN/postgres" -D "$PGDATA" -c listen_addresses=127.0.0.1 -c port="$pg_port" \
    -c unix_socket_directories= -c password_encryption=scram-sha-256
  pg_databases "$(awk '$1 == "postgres" {print $2}' "$STATE/pids")"
  "$BIN/python" -c "import optuna, sys; optuna.storages.RDBStorage(sys.argv[1])" "$SPECTUNE_STORAGE" >/dev/null  # Optuna's tables
  # MLflow's job runner (GenAI jobs: three more processes polling the store) serves nothing spectune logs.
  # The basic-auth app: every request but /health and static files needs the user and password; its
  # Flask secret (CSRF of the sign-up form) is made anew each start, in the server's environment only.
  (
    MLFLOW_FLASK_SERVER_SECRET_KEY=$(secret 32)
    export MLFLOW_FLASK_SERVER_SECRET_KEY MLFLOW_AUTH_CONFIG_PATH=$STATE/mlflow-auth.ini MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false
    start_group mlflow "$BIN/mlflow" server --app-name basic-auth --host 127.0.0.1 --port "$mlflow_port" --workers 1 \
      --backend-store-uri "$mlflow_store" --artifacts-destination "$STATE/mlartifacts"
  )
  # optuna-dashboard has no login of its own (and a delete button on every study): it is served behind
  # basic auth with MLflow's user and password
  start_group optuna-dashboard "$BIN/python" "$ROOT/infra/optuna_dashboard_auth.py" "$SPECTUNE_STORAGE" --host 127.0.0.1 --port "$optuna_port"
  wait_http "http://127.0.0.1:$mlflow_port/health" 120 mlflow
  "$BIN/python" -c "$HTTP_OK" "http://127.0.0.1:$mlflow_port/api/2.0/mlflow/experiments/search?max_results=1" mlflow 60 ||
    die "the MLflow server refuses the user and password of $STATE/mlflow-auth.ini (log: $STATE/mlflow.log)"
  wait_http "http://127.0.0.1:$optuna_port/" 60 optuna-dashboard
  check_ports

  # the Ray head (its processes inherit the stores' addresses above), then its worker raylets
  start_ray_head
  wait_http "http://127.0.0.1:$dash_port/api/version" 180 ray
  write_env RAY_ADDRESS="http://127.0.0.1:$dash_port" RAY_GCS_ADDRESS="$NODE_IP:$ray_port" RAY_AUTH_MODE="$RAY_AUTH_MODE" \
    RAY_AUTH_TOKEN_PATH="$RAY_AUTH_TOKEN_PATH" MLFLOW_TRACKING_URI="$MLFLOW_TRACKING_URI" \
    MLFLOW_TRACKING_USERNAME="$MLFLOW_TRACKING_USERNAME" MLFLOW_TRACKING_PASSWORD="$MLFLOW_TRACKING_PASSWORD" \
    SPECTUNE_STORAGE="$SPECTUNE_STORAGE" PGHOST="$PGHOST" PGPORT="$PGPORT" PGUSER="$PGUSER" PGPASSFILE="$PGPASSFILE" \
    OPTUNA_DASHBOARD_URL="http://127.0.0.1:$optuna_port"
  chmod 600 "$STATE/env"
  # jobs are handed to the head node's dashboard agent: a submit before it listens is refused
  local agent i
  agent=$(agent_port "$ray_tmp" ray)
  wait_http "http://127.0.0.1:$agent/api/local_raylet_healthz" 120 ray
  local -a w_tmps=()
  for i in $(seq 1 "$workers"); do
    w_tmps+=("$(mktemp -d /tmp/spectune-rayw-XXXX)")
    echo "${w_tmps[-1]}" >> "$STATE/tmpdirs"
    start_group "ray-worker-$i" "${RAY_CLI[@]}" start --block --address "$NODE_IP:$ray_port" --node-ip-address "$NODE_IP" \
      --dashboard-agent-listen-port 0 --num-cpus "$worker_cpus" --disable-usage-stats --temp-dir "${w_tmps[-1]}" \
      $(host_label "worker-$i")
  done
  for i in $(seq 1 "$workers"); do
    agent=$(agent_port "${w_tmps[$((i - 1))]}" "ray-worker-$i")
    wait_http "http://127.0.0.1:$agent/api/local_raylet_healthz" 120 "ray-worker-$i"
  done
  check_ports
  echo "spectune: services up (state in $STATE):"
  echo "  Ray jobs / dashboard  http://127.0.0.1:$dash_port ($((workers + 1)) nodes at $NODE_IP; token: the file $RAY_AUTH_TOKEN_PATH)"
  echo "  MLflow UI             http://127.0.0.1:$mlflow_port (user spectune, password: MLFLOW_TRACKING_PASSWORD in the env file)"
  echo "  optuna-dashboard      http://127.0.0.1:$optuna_port (the same user and password)"
  echo "  PostgreSQL            127.0.0.1:$pg_port (databases optuna, mlflow, mlflow_auth; data in $PGDATA)"
  echo "  source $STATE/env     # the addresses and credentials, for ray job submit, spectune and the MLflow client"
}

case "$cmd" in
  start) start ;;
  stop) stop_all ;;
  purge) purge ;;
  status)
    [ -f "$STATE/pids" ] || { echo "spectune: no services recorded in $STATE"; exit 1; }
    while read -r name pgid; do
      if group_alive "$pgid"; then echo "$name: running (process group $pgid)"; else echo "$name: not running"; fi
    done < "$STATE/pids"
    if [ -f "$STATE/env" ]; then
      port=$(sed -n 's/^export PGPORT=//p' "$STATE/env")
      echo "PostgreSQL at 127.0.0.1:$port, data in $(readlink -f "$STATE/pg")"
    fi
    ;;
  *) echo "usage: $0 start|stop|status|purge [STATE_DIR]" >&2; exit 2 ;;
esac
