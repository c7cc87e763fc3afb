"""What a `spectune run` driver leaves behind if it dies, and how it is cleaned up.

A driver that starts an embedded local Ray marks every process it starts: before `ray.init` it puts
a fresh token in its environment (`SPECTUNE_DRIVER_TOKEN`), which the GCS, the raylet, the agents
and every worker / actor process inherit. It records itself in `$SPECTUNE_HOME/drivers/<host>-<pid>.json`
(pid, process start time, token) and starts a small watchdog in its own session that holds the
read end of a pipe from the driver. When the driver ends in any way, SIGKILL included, the pipe
closes and the watchdog kills every process that still carries the token, then removes the record.
If the watchdog was killed too, the next `spectune run` does the same for every record whose
driver is gone (`reap_dead`). Processes are only ever matched by that token in /proc/PID/environ,
or by a file open for writing inside this driver's Ray session directory (also in the record), re-checked
right before the kill: never by name, never `ray stop`. The second handle is needed because Ray
renames its processes with setproctitle, which overwrites the start of the environment block
(the agents' environment comes in hash order, so any variable may be among those lost).

Under `ray job submit` (RAY_ADDRESS set) Ray owns the actors' lifetime (they die with their owner,
the job's driver) and nothing here runs. Linux only (/proc); elsewhere it does nothing.

    python -m orchestrator.study.drivers watch TOKEN RECORD   # the watchdog (started by DriverRecord)
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

from orchestrator.config.envpolicy import NVLS_OFF_ENV

TOKEN_VAR = "SPECTUNE_DRIVER_TOKEN"


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (with the pid, a unique identity)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _writes_under(pid: int, folder: str) -> bool:
    """The process holds a file inside `folder` open for writing (Ray processes write their logs
    there; a reader such as `tail -f` does not count)."""
    prefix = folder.rstrip("/") + "/"
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if not os.readlink(f"/proc/{pid}/fd/{fd}").startswith(prefix):
                continue
            flags = next(line for line in Path(f"/proc/{pid}/fdinfo/{fd}").read_text().splitlines() if line.startswith("flags:"))
            if int(flags.split()[1], 8) & (os.O_WRONLY | os.O_RDWR):
                return True
        except (OSError, StopIteration, ValueError, IndexError):
            continue
    return False


def _has_token(pid: int, token: str, session_dir: str | None = None) -> bool:
    """The process carries this driver's token, or writes a file in its Ray session dir."""
    try:
        if f"{TOKEN_VAR}={token}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
            return True
    except OSError:
        return False
    return bool(session_dir) and _writes_under(pid, session_dir)


def ray_session_dir() -> str | None:
    """The connected Ray node's session directory (unique per `ray.init` of a local cluster)."""
    try:
        import ray._private.worker as ray_worker

        return ray_worker._global_node.get_session_dir_path()
    except Exception:  # noqa: BLE001 - private API: without it only the token identifies processes
        return None


def processes_with_token(token: str, session_dir: str | None = None) -> list[int]:
    """Live processes (zombies excluded) started with this driver token in their environment
    (or, with `session_dir`, writing a file in that Ray session directory)."""
    me, out = os.getpid(), []
    if not os.path.isdir("/proc"):
        return out
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != me and _has_token(int(name), token, session_dir):
            try:
                state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state != "Z":
                out.append(int(name))
    return out


def kill_token(token: str, session_dir: str | None = None, rounds: int = 20) -> int:
    """SIGKILL every process carrying the token (a raylet may start workers meanwhile: repeat
    until none is left). Returns how many were killed."""
    killed: set[int] = set()
    for _ in range(rounds):
        pids = processes_with_token(token, session_dir)
        if not pids:
            break
        for pid in pids:
            born = start_time(pid)
            if born is None or not _has_token(pid, token, session_dir):
                continue  # gone, or the pid now belongs to someone else
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.1)
    return len(killed)


def process_alive(pid: int, born: int | None) -> bool:
    """The process `pid` exists and, given its recorded start time `born`, is still the same process
    (a pid is reused once its process is gone; pid and start time together name one process)."""
    now = start_time(pid)
    if now is None:  # no /proc entry (gone), or no /proc at all: ask the kernel about the pid alone
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return not os.path.isdir("/proc")
    return born is None or now == born


class DriverRecord:
    """This driver's record and watchdog (embedded local Ray only)."""

    def __init__(self, home: Path):
        self.dir = home / "drivers"
        self.token = uuid.uuid4().hex
        self.path = self.dir / f"{socket.gethostname()}-{os.getpid()}.json"
        self.watchdog: subprocess.Popen | None = None
        self.record: dict = {}

    def start(self, ray_temp_dir: str | None) -> None:
        os.environ[TOKEN_VAR] = self.token  # inherited by every process Ray starts from here on
        self.dir.mkdir(parents=True, exist_ok=True)
        record = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "start_time": start_time(os.getpid()),
            "token": self.token,
            "ray_temp_dir": ray_temp_dir,
            "started": time.time(),
        }
        self._write(record)
        env = {**{k: v for k, v in os.environ.items() if k != TOKEN_VAR}, **NVLS_OFF_ENV}
        self.watchdog = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.study.drivers", "watch", self.token, str(self.path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
            cwd=str(Path(__file__).resolve().parents[2]),
        )

    def _write(self, record: dict) -> None:
        self.record = record
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        tmp.replace(self.path)

    def note_session(self, session_dir: str | None) -> None:
        """Once Ray is up: its session directory, the second handle on its processes."""
        if session_dir:
            self._write({**self.record, "session_dir": session_dir})

    def close(self) -> int:
        """After Ray shut down: kill stragglers, drop the record, let the watchdog go."""
        killed = kill_token(self.token, self.record.get("session_dir"))
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
        if rec.get("host") != host or process_alive(int(rec["pid"]), rec.get("start_time")):
            continue
        killed = kill_token(str(rec["token"]), rec.get("session_dir"))
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
    try:
        session_dir = json.loads(Path(record).read_text()).get("session_dir")
    except (OSError, ValueError):
        session_dir = None
    kill_token(token, session_dir)
    Path(record).unlink(missing_ok=True)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "watch":
        _watch(sys.argv[2], sys.argv[3])
    else:
        sys.exit("usage: python -m orchestrator.study.drivers watch TOKEN RECORD")
