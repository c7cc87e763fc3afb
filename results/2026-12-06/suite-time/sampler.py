import os, sys, time, json, collections
HZ = os.sysconf("SC_CLK_TCK")
seen = {}
def cat(cmd):
    c = cmd
    if "pytest" in c and "-n" in c: return "pytest-controller"
    if "exec(eval(sys.stdin" in c: return "pytest-worker"
    if "forkserver" in c: return "forkserver(+ranks)"
    if "spawn_main" in c: return "spawned-rank"
    if "orchestrator run" in c or "spectune run" in c: return "driver:run"
    if "orchestrator decode" in c or "spectune decode" in c: return "cli:decode"
    if "orchestrator train-drafter" in c: return "cli:train"
    if "orchestrator" in c or "bin/spectune" in c: return "cli:other"
    if "default_worker.py" in c or "ray::" in c: return "ray:worker"
    if "raylet" in c: return "ray:raylet"
    if "gcs_server" in c: return "ray:gcs"
    if "dashboard" in c or "agent" in c: return "ray:agents"
    if "log_monitor" in c or "monitor.py" in c: return "ray:monitor"
    if "mlflow" in c or "gunicorn" in c or "uvicorn" in c: return "mlflow-server"
    if "postgres" in c: return "postgres"
    if "chrom" in c: return "chromium"
    if "ray" in c: return "ray:other"
    return "other:" + c[:40]
out = sys.argv[1]
while not os.path.exists(out + ".stop"):
    for pid in os.listdir("/proc"):
        if not pid.isdigit(): continue
        try:
            st = open(f"/proc/{pid}/stat").read()
            cmd = open(f"/proc/{pid}/cmdline").read().replace("\0", " ")
        except OSError:
            continue
        f = st.rsplit(")", 1)[1].split()
        ut, stt, start = int(f[11]), int(f[12]), f[19]
        if not cmd: continue
        key = (pid, start)
        prev = seen.get(key)
        c = prev[0] if prev and prev[0] != "other:" else cat(cmd)
        seen[key] = (c, (ut + stt) / HZ)
    time.sleep(0.3)
agg = collections.Counter(); n = collections.Counter()
for (pid, s), (c, t) in seen.items():
    agg[c] += t; n[c] += 1
json.dump({k: [round(v, 1), n[k]] for k, v in agg.most_common()}, open(out, "w"), indent=1)
