#!/usr/bin/env bash
# The main job as a user runs it, with one crash: `spectune validate`, then `spectune run` killed with
# SIGKILL once mid-trial, the same command again (it resumes), `spectune report`, and checks. Runs on
# the GPU machine once `infra/device-setup.sh` has installed Ray, Optuna and MLflow (docs/gpu.md),
# or anywhere spectune is installed (PYTHON=.venv/bin/python):
#
#   OUT=/tmp/out bash infra/gpu-study.sh experiments/h200-1gpu.yaml [--kill-at N] [--no-kill] [--set key=value ...]
#
# --kill-at N (default 2): the driver is killed once trial N (or a later one) has been RUNNING for
# KILL_DELAY seconds (default 1.5), so the kill lands inside a trial, not between two. DEADLINE_S (default
# 540) bounds the whole script's study time, so that it ends inside one 10-minute device call.
# Into $OUT (at most 8 files, what the device call brings back): log.txt (everything, in order),
# summary.json (the resumed run's summary, `$SPECTUNE_HOME/summaries/<study>.json`), optuna.db, mlflow.db, report.html, best_config.yaml,
# report_summary.json, check.json. The study lives in $WORK (default /tmp/spectune-study; a previous
# study there is removed first): SPECTUNE_HOME, the SQLite stores, Ray's session folder.
# check.json must say ok: exactly study.n_trials COMPLETE (or fewer where they are every distinct configuration
# of a finite space, as the study itself ends then), the killed trial FAIL (its reason recorded)
# and its params retried to COMPLETE, no process of the study left. Exit 0 only then.
set -uo pipefail
cd "$(dirname "$0")/.."
exp=${1:?usage: gpu-study.sh EXPERIMENT.yaml [--kill-at N] [--no-kill] [--set key=value ...]}
shift
kill_at=2
sets=()
while [ $# -gt 0 ]; do
  case $1 in
    --kill-at) kill_at=$2; shift 2 ;;
    --no-kill) kill_at=-1; shift ;;
    --set) sets+=("--set" "$2"); shift 2 ;;
    --set=*) sets+=("--set" "${1#--set=}"); shift ;;
    *) echo "gpu-study: unknown argument $1" >&2; exit 2 ;;
  esac
done
OUT=${OUT:-/tmp/spectune-study-out}
WORK=${WORK:-/tmp/spectune-study}
VENV=${SPECTUNE_VENV:-/tmp/spectune-venv}
# NVLink multicast off before anything starts; every process below inherits it
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
[ -f "$VENV/spectune.env" ] && . "$VENV/spectune.env"
export RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-$( [ -x "$VENV/bin/python" ] && echo "$VENV/bin/python" || echo python3 )}

if [ -e "$WORK" ]; then
  [ -f "$WORK/.spectune-gpu-study" ] || { echo "gpu-study: $WORK exists and is not a study folder of this script" >&2; exit 2; }
  rm -rf "$WORK"
fi
mkdir -p "$WORK/home" "$OUT"
touch "$WORK/.spectune-gpu-study"
export SPECTUNE_HOME=$WORK/home SPECTUNE_RAY_TMPDIR=$WORK/ray
mark=$(cat /proc/sys/kernel/random/uuid)   # every process of the study carries it (the leak check)
sets+=(--set "study.storage=sqlite:///$WORK/home/optuna.db" --set "tracking.uri=sqlite:///$WORK/home/mlflow.db")
log=$OUT/log.txt
touch "$log"   # appended to: a setup step before this script may have written to it
say() { echo "gpu-study: $*" | tee -a "$log"; }
S=("$PY" -m orchestrator)
t_all=$SECONDS

say "experiment $exp ${sets[*]}; kill at trial $kill_at; python $PY; work $WORK"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a "$log"

say "spectune validate"
"${S[@]}" validate "$exp" "${sets[@]}" 2>&1 | tee -a "$log"
[ "${PIPESTATUS[0]}" -eq 0 ] || { say "validate failed"; exit 2; }

# ---- run 1, killed mid-trial
t0=$SECONDS
say "spectune run (first driver)"
SPECTUNE_STUDY_MARK=$mark "${S[@]}" run "$exp" "${sets[@]}" > "$WORK/run1.out" 2>> "$log" &
driver=$!
killed="[]"
if [ "$kill_at" -ge 0 ]; then
  killed=$("$PY" - "$WORK/home/optuna.db" "$driver" "$kill_at" "${KILL_DELAY:-1.5}" <<'PY'
import json, os, signal, sqlite3, sys, time
db, pid, at, delay = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])

def running():
    if not os.path.exists(db):
        return []
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            return [n for (n,) in con.execute("select number from trials where state = 'RUNNING' order by number")]
        finally:
            con.close()
    except sqlite3.Error:
        return []

def alive():
    try:
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:  # not our child (it is the shell's): ask the kernel
        try:
            return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

seen = {}  # trial number -> when first seen RUNNING
while alive():
    now = time.monotonic()
    for n in running():
        seen.setdefault(n, now)
        if n >= at and now - seen[n] >= delay:
            os.kill(pid, signal.SIGKILL)
            time.sleep(0.5)
            print(json.dumps(running()))  # left RUNNING by the dead driver: the trials it was inside
            sys.exit(0)
    time.sleep(0.2)
print("null")  # the driver ended before a trial >= at had run for `delay` seconds
PY
)
  say "SIGKILL sent to driver $driver; trials it left RUNNING: $killed"
fi
wait "$driver"; rc1=$?
say "first driver ended: rc=$rc1 after $((SECONDS - t0)) s"

leaks() {  # processes of the study still alive: they carry the mark, or hold files in its Ray folder
  "$PY" - "$mark" "$WORK/ray" <<'PY'
import json, os, sys
mark, folder = sys.argv[1].encode(), sys.argv[2]
me = os.getpid()
found = []
for d in os.listdir("/proc"):
    if not d.isdigit() or int(d) == me:
        continue
    try:
        env = open(f"/proc/{d}/environ", "rb").read().split(b"\0")
        ours = b"SPECTUNE_STUDY_MARK=" + mark in env
        if not ours:
            for fd in os.listdir(f"/proc/{d}/fd"):
                if os.readlink(f"/proc/{d}/fd/{fd}").startswith(folder + "/"):
                    ours = True
                    break
        if ours:
            found.append({"pid": int(d), "cmd": open(f"/proc/{d}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")[:160]})
    except OSError:
        continue
print(json.dumps(found))
PY
}
# the dead driver's watchdog tears its Ray processes down; give it a moment
for _ in $(seq 60); do [ "$(leaks)" = "[]" ] && break; sleep 1; done
after_kill=$(leaks)
say "processes of the killed driver left after the watchdog: $after_kill"

# ---- run 2: the same command resumes
t0=$SECONDS
say "spectune run (resume)"
SPECTUNE_STUDY_MARK=$mark "${S[@]}" run "$exp" "${sets[@]}" > "$WORK/run2.out" 2>> "$log" &
driver=$!
# one device call lasts at most 10 minutes: past DEADLINE_S the driver is stopped the clean way
# (SIGTERM = Ctrl-C: the trial in flight fails and is re-enqueued), so the report and the stores still come back
while kill -0 "$driver" 2>/dev/null && [ $((SECONDS - t_all)) -lt "${DEADLINE_S:-540}" ]; do sleep 1; done
kill -0 "$driver" 2>/dev/null && { say "DEADLINE_S=${DEADLINE_S:-540} reached: SIGTERM to driver $driver"; kill -TERM "$driver"; }
wait "$driver"; rc2=$?
cat "$WORK/run1.out" "$WORK/run2.out" >> "$log"
cp "$WORK/home/summaries/"*.json "$OUT/summary.json" 2>/dev/null
say "resumed driver ended: rc=$rc2 after $((SECONDS - t0)) s; verdict: $(tail -n 1 "$WORK/run2.out")"
for _ in $(seq 30); do [ "$(leaks)" = "[]" ] && break; sleep 1; done
at_end=$(leaks)

# ---- report
say "spectune report"
"${S[@]}" report "$exp" "${sets[@]}" --out "$WORK/report" >> "$log" 2>&1; rc3=$?
cp "$WORK/report/report.html" "$WORK/report/best_config.yaml" "$OUT/" 2>/dev/null
cp "$WORK/report/summary.json" "$OUT/report_summary.json" 2>/dev/null
cp "$WORK/home/optuna.db" "$WORK/home/mlflow.db" "$OUT/"

# ---- checks
"$PY" - "$WORK/home/optuna.db" "$OUT/summary.json" "$killed" "$after_kill" "$at_end" "$rc2" "$rc3" "$((SECONDS - t_all))" "$kill_at" \
    "$exp" "${sets[@]}" > "$OUT/check.json" <<'PY'
import json, os, sqlite3, sys
from orchestrator.config.schema import load_config
db, summary_path, killed, after_kill, at_end, rc2, rc3, wall, kill_at, exp = sys.argv[1:11]
n_goal = load_config(exp, [v for k, v in zip(sys.argv[11::2], sys.argv[12::2]) if k == "--set"]).study.n_trials
con = sqlite3.connect(db)
rows = con.execute("select trial_id, number, state from trials order by number").fetchall()
attrs = {}
for tid, key, value in con.execute("select trial_id, key, value_json from trial_user_attributes"):
    attrs.setdefault(tid, {})[key] = json.loads(value)
states = {n: s for _, n, s in rows}
by_number = {n: attrs.get(tid, {}) for tid, n, _ in rows}
def read(path):
    try:
        return json.loads(open(path).read())
    except (OSError, ValueError):
        return {}
summary = read(summary_path)  # the run's: whether a finite space ran out
report = read(os.path.join(os.path.dirname(summary_path), "report_summary.json"))  # the report's: the winner
killed = json.loads(killed) or []
complete = sum(s == "COMPLETE" for s in states.values())
retries = {a["spectune.retry_of"]: n for n, a in by_number.items() if "spectune.retry_of" in a}
out = {
    "n_trials": n_goal, "complete": complete, "states": {s: sum(v == s for v in states.values()) for s in set(states.values())},
    "killed_trials": [{"number": k, "state": states.get(k), "fail_reason": by_number.get(k, {}).get("spectune.fail_reason"),
                       "retried_as": retries.get(k), "retry_state": states.get(retries.get(k))} for k in killed],
    "processes_left_after_kill": json.loads(after_kill), "processes_left_at_end": json.loads(at_end),
    "resume_rc": int(rc2), "report_rc": int(rc3), "wall_s": int(wall),
    "best_trial": report.get("best_trial"), "best_params": report.get("best_params"), "best_value": report.get("best_value"),
    "space_exhausted": bool(summary.get("space_exhausted")), "space_size": summary.get("space_size"),
}
problems = []
# every configuration of a finite space measured or ruled out ends the study before n_trials (`spectune
# run` says so and exits 0)
if n_goal is None or not (complete == n_goal or (complete < n_goal and out["space_exhausted"])):
    problems.append(f"{complete} COMPLETE, want study.n_trials={n_goal}" + (f" or the space's {out['space_size']}" if out["space_size"] else ""))
if not killed and int(kill_at) >= 0:
    problems.append("the kill did not land inside a trial")
for k in out["killed_trials"]:
    if k["state"] != "FAIL" or not k["fail_reason"]:
        problems.append(f"killed trial {k['number']} is {k['state']} (reason {k['fail_reason']!r}), want FAIL with a reason")
    if k["retry_state"] != "COMPLETE":
        problems.append(f"killed trial {k['number']}'s params were not retried to COMPLETE (retry {k['retried_as']}: {k['retry_state']})")
if out["processes_left_after_kill"] or out["processes_left_at_end"]:
    problems.append("processes of the study were left running")
if int(rc2) != 0 or int(rc3) != 0:
    problems.append(f"resume rc={rc2}, report rc={rc3}")
out["ok"], out["problems"] = not problems, problems
print(json.dumps(out, indent=1))
PY
cat "$OUT/check.json" | tee -a "$log"
say "done in $((SECONDS - t_all)) s; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
"$PY" -c 'import json, sys; sys.exit(0 if json.load(open(sys.argv[1]))["ok"] else 1)' "$OUT/check.json"
