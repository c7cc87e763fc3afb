"""Which of the ports infra/services.sh handed out are held by a process outside the service they were for.

services.sh picks each service's port by binding port 0 and releasing it, then starts the service,
which binds the port seconds later. In between, any process on the machine that binds port 0 can be
given the same port (Ray picks its own ports that way; its metrics exporters answer 200 to any GET).
The service then fails to bind, and an HTTP readiness check may be answered by the stranger. So
after starting (and after a failed start), services.sh asks this script whether any port recorded
in STATE_DIR/ports is listened on by a process outside the process group of the service it was
picked for; if so, it stops what it started and starts again on fresh ports.

    python infra/ports_taken.py STATE_DIR   # exit 75 and one line per port taken; 0 when none is

STATE_DIR/ports: `service port` per line (services.sh's pick_port); STATE_DIR/pids: `service pgid`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import psutil

TAKEN = 75  # EX_TEMPFAIL: start again on fresh ports


def _group_pids(pgid: int, table: dict[int, tuple[int, int]] | None = None) -> set[int]:
    """The processes of process group `pgid` and their descendants (a service's children may start
    sessions of their own). table: pid -> (pgid, parent pid) of every process (`_process_table`)."""
    table = table if table is not None else _process_table()
    children: dict[int, list[int]] = {}
    for pid, (_, ppid) in table.items():
        children.setdefault(ppid, []).append(pid)
    members, todo = set(), [pid for pid, (group, _) in table.items() if group == pgid]
    while todo:
        pid = todo.pop()
        if pid not in members:
            members.add(pid)
            todo += children.get(pid, [])
    return members


def _process_table() -> dict[int, tuple[int, int]]:
    """pid -> (process group, parent pid) of every process, read once."""
    table = {}
    for proc in psutil.process_iter(["ppid"]):
        try:
            table[proc.pid] = (os.getpgid(proc.pid), proc.info["ppid"])
        except (ProcessLookupError, psutil.Error):
            continue
    return table


def _listeners() -> dict[int, set[int | None]]:
    """port -> the pids listening on it (TCP, any address); None where the process is another user's."""
    out: dict[int, set[int | None]] = {}
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN:
            out.setdefault(conn.laddr.port, set()).add(conn.pid)
    return out


def _who(pid: int | None) -> str:
    if pid is None:
        return "a process of another user"
    try:
        command = " ".join(" ".join(psutil.Process(pid).cmdline()).split())  # one line, whatever the arguments hold
        return f"pid {pid} ({command[:120]})"
    except psutil.Error:
        return f"pid {pid}"


def strangers(port: int, pgid: int | None, listeners: dict[int, set[int | None]] | None = None, table=None) -> list[int | None]:
    """The processes listening on `port` outside process group `pgid` (None: no group, so all of them)."""
    holders = (listeners if listeners is not None else _listeners()).get(port, set())
    ours = _group_pids(pgid, table) if pgid is not None and holders else set()
    return [pid for pid in holders if pid not in ours]


def taken(state: Path) -> list[str]:
    """One line per recorded port that a process outside its service's group listens on."""
    ports_file, pids_file = state / "ports", state / "pids"
    if not ports_file.exists():
        return []
    groups = dict(line.split() for line in pids_file.read_text().splitlines() if line.strip()) if pids_file.exists() else {}
    listeners, table, lines = _listeners(), _process_table(), []
    for line in ports_file.read_text().splitlines():
        if not line.strip():
            continue
        service, port = line.split()
        pgid = int(groups[service]) if service in groups else None
        if others := strangers(int(port), pgid, listeners, table):
            lines.append(f"port {port}, picked for {service}, is held by {_who(others[0])}")
    return lines


def main() -> int:
    lines = taken(Path(sys.argv[1]))
    for line in lines:
        print(f"spectune: {line}", file=sys.stderr)
    return TAKEN if lines else 0


if __name__ == "__main__":
    sys.exit(main())
