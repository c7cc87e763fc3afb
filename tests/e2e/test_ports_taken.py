"""infra/ports_taken.py on real sockets: a port picked for a service and listened on by a process outside
that service's process group (and its descendants) is reported, with exit 75, so that services.sh
starts again on fresh ports; ports the service itself holds, or nobody holds, are not.

    .venv/bin/python -m pytest tests/e2e/test_ports_taken.py
"""

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# listens on a port of its own choosing, prints it; with an argument, first starts a child of its own
# (in a session of its own) that does the same, and prints the child's port and pid too
LISTEN = r"""
import socket, subprocess, sys, time
if len(sys.argv) > 1:
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=subprocess.PIPE, text=True, start_new_session=True)
    print(child.stdout.readline().strip(), child.pid, flush=True)
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen()
print(s.getsockname()[1], flush=True)
time.sleep(120)
"""


def _start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", LISTEN, *args], stdout=subprocess.PIPE, text=True, start_new_session=True)


def test_a_port_held_outside_its_service_is_reported_and_its_own_are_not(tmp_path):
    service = _start(LISTEN)  # the service's leader and a child that left its process group
    stranger = _start()
    try:
        child_port, child_pid = map(int, service.stdout.readline().split())
        own_port = int(service.stdout.readline())
        stranger_port = int(stranger.stdout.readline())
        assert os.getpgid(child_pid) != service.pid  # the child is in a session of its own
        (tmp_path / "pids").write_text(f"svc {service.pid}\n")
        ports = [f"svc {own_port}", f"svc {child_port}", "other 1"]  # `other` has no group and port 1 no listener

        def run(lines):
            (tmp_path / "ports").write_text("\n".join(lines) + "\n")
            return subprocess.run([sys.executable, str(ROOT / "infra/ports_taken.py"), str(tmp_path)], capture_output=True, text=True)

        clean = run(ports)
        assert clean.returncode == 0 and clean.stderr == "", clean.stderr

        taken = run([*ports, f"svc {stranger_port}"])
        assert taken.returncode == 75, taken.stderr
        assert len(taken.stderr.splitlines()) == 1, taken.stderr
        (line,) = taken.stderr.splitlines()
        assert f"port {stranger_port}, picked for svc, is held by pid {stranger.pid}" in line, line

        # a port picked for one service and held by another service's process is taken too
        (tmp_path / "pids").write_text(f"svc {service.pid}\nmlflow {stranger.pid}\n")
        crossed = run([f"mlflow {own_port}"])
        assert crossed.returncode == 75 and f"port {own_port}, picked for mlflow, is held by pid {service.pid}" in crossed.stderr
    finally:
        for proc in (service, stranger):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if "child_pid" in locals():
            os.kill(child_pid, signal.SIGKILL)
