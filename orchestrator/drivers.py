"""What a `spectune run` driver leaves behind if it dies, and how it is cleaned up.

A driver that starts an embedded local Ray marks every process it starts: before `ray.init` it puts
a fresh token in its environment (`SPECTUNE_DRIVER_TOKEN`), which the GCS, the raylet, the agents
and every worker / actor process inherit. It records itself in `$SPECTUNE_HOME/drivers/<host>-<pid>.json`
(pid, process start time, token) and starts a small watchdog in its own session that holds the
read end of a pipe from the driver. When the driver ends in any way, SIGKILL included, the pipe
closes and the watchdog kills every process that still carries the token, then removes the record.
If the watchdog was killed too, the next `spectune run` does the same for every record whose
driver is gone (`reap_dead`). Processes are only ever matched by that token in /proc/PID/environ,
re-checked right before the kill: never by name, never `ray stop`.

Under `ray job submit` (RAY_ADDRESS set) Ray owns the actors' lifetime (they die with their owner,
the job's driver) and nothing here runs. Linux only (/proc); elsewhere it does nothing.

    python -m orchestrator.drivers watch TOKEN RECORD   # the watchdog (started by DriverRecord)
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

TOKEN_VAR = "SPECTUNE_DRIVER_TOKEN"


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (with the pid, a unique identity)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _has_token(pid: int, token: str) -> bool:
    try:
        return f"{TOKEN_VAR}={token}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def processes_with_token(token: str) -> list[int]:
    """Live processes (zombies excluded) started with this driver token in their environment."""
    me, out = os.getpid(), []
    if not os.path.isdir("/proc"):
        return out
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != me and _has_token(int(name), token):
            try:
                state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state != "Z":
                out.append(int(name))
    return out


def kill_token(token: str, rounds: int = 20) -> int:
    """SIGKILL every process carrying the token (a raylet may start workers meanwhile: repeat
    until none is left). Returns how many were killed."""
    killed: set[int] = set()
    for _ in range(rounds):
        pids = processes_with_token(token)
        if not pids:
            break
        for pid in pids:
            born = start_time(pid)
            if born is None or not _has_token(pid, token):
                continue  # gone, or the pid now belongs to someone else
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.1)
    return len(killed)


def _alive(pid: int, born: int | None) -> bool:
    now = start_time(pid)
    return now is not None and (born is None or now == born)


class DriverRecord:
    """This driver's record and watchdog (embedded local Ray only)."""

    def __init__(self, home: Path):
        self.dir = home / "drivers"
        self.token = uuid.uuid4().hex
        self.path = self.dir / f"{socket.gethostname()}-{os.getpid()}.json"
        self.watchdog: subprocess.Popen | None = None

    def start(self, ray_temp_dir: str | None) -> None:
        os.environ[TOKEN_VAR] = self.token  # inherited by every process Ray starts from here on
        self.dir.mkdir(parents=True, exist_ok=True)
        record = {"host": socket.gethostname(), "pid": os.getpid(), "start_time": start_time(os.getpid()),
                  "token": self.token, "ray_temp_dir": ray_temp_dir, "started": time.time()}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        tmp.replace(self.path)
        env = {k: v for k, v in os.environ.items() if k != TOKEN_VAR}
        self.watchdog = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.drivers", "watch", self.token, str(self.path)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, env=env, cwd=str(Path(__file__).resolve().parents[1]),
        )

    def close(self) -> int:
        """After Ray shut down: kill stragglers, drop the record, let the watchdog go."""
        killed = kill_token(self.token)
        self.path.unlink(missing_ok=True)
        if self.watchdog is not None:
            try:
                self.watchdog.stdin.close()
                self.watchdog.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                pass
        os.environ.pop(TOKEN_VAR, None)
        return killed


def reap_dead(home: Path, log) -> int:
    """Kill what dead drivers on this host left behind; returns the number of processes killed."""
    folder, host, total = home / "drivers", socket.gethostname(), 0
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if rec.get("host") != host or _alive(int(rec["pid"]), rec.get("start_time")):
            continue
        killed = kill_token(str(rec["token"]))
        path.unlink(missing_ok=True)
        total += killed
        if killed:
            log(f"spectune: driver {host}:{rec['pid']} died and left {killed} Ray processes behind: killed them")
    return total


def _watch(token: str, record: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's business; EOF is ours
    try:
        while sys.stdin.buffer.read(4096):
            pass
    except OSError:
        pass
    kill_token(token)
    Path(record).unlink(missing_ok=True)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "watch":
        _watch(sys.argv[2], sys.argv[3])
    else:
        sys.exit("usage: python -m orchestrator.drivers watch TOKEN RECORD")
