"""The Ray cluster a study runs on: connect to it (RAY_ADDRESS, e.g. under `ray job submit`, or an
embedded local Ray), the resources a gang asks of it, and a fail-fast check that some node can hold
the gang at all. The gang itself is orchestrator/execution/gang.py, the reuse of gangs across trials
orchestrator/execution/pool.py.

    connect()                                   # RAY_ADDRESS or an embedded local Ray (loopback only)
    check_capacity(spec, Resources())           # PlacementError (one line) when no node fits
    cluster_nodes()                             # the live nodes as NodeInfo (address, boot id, host label)
    node_alive(node_id)                         # the node is still in the cluster (its raylet answers)
"""

from __future__ import annotations

import contextlib
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from orchestrator.config.envpolicy import nvls_off_here
from orchestrator.errors import UserError
from orchestrator.execution.slots import HOST_LABEL, NodeInfo
from workers.spec import GangSpec


class PlacementError(UserError):
    """The gang cannot be placed on this cluster (one line: what was asked, what there is)."""


@dataclass(frozen=True)
class Resources:
    cpus_per_worker: float = 0.25
    placement_timeout_s: float = 60.0
    call_timeout_s: float = 900.0
    setup_timeout_s: float = 600.0
    # the resource a verifier rank takes one unit of: GPU on cuda, none on cpu; a custom resource
    # (declared unit-instance: RAY_custom_unit_instance_resources) stands in for GPUs in CPU tests
    gpu_resource: str | None = None
    # the Ray node the gang must land on (its `ray.io/node-id` label): a slot of an isolated study
    node_id: str | None = None


def assigned_instances(resource: str) -> list[int]:
    """Inside an actor: the ids of the unit instances of `resource` Ray assigned it (for GPU: its GPU ids)."""
    import ray

    if resource == "GPU":
        return sorted(int(i) for i in ray.get_gpu_ids())
    ids = ray._private.worker.global_worker.core_worker.resource_ids()
    return sorted({int(i) for key, pairs in ids.items() if key == resource or key.startswith(resource + "_group_") for i, _ in pairs})


def private_token() -> Path:
    """$SPECTUNE_HOME/ray-token, made once (32 random bytes, hex), readable by its owner only: the embedded
    Ray's token (Ray's own default file, ~/.ray/auth_token, is created world-readable). Drivers starting
    at once on a fresh home agree on one token: each writes its own private file and links it into
    place; whoever links first wins and the others read that one."""
    import secrets
    import tempfile

    from orchestrator.config.schema import spectune_home

    path = spectune_home() / "ray-token"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".ray-token-")  # mode 600
        try:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))
            os.link(tmp, path)  # atomic, and fails where the token exists: never replaces one a Ray uses
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    os.chmod(path, 0o600)
    return path


def embedded_auth_env() -> None:
    """Where no RAY_ADDRESS names a cluster: the embedded Ray listens on loopback only, and loopback is
    every local user, so it asks for a token (RAY_AUTH_MODE=token) kept in a file only this user reads
    (`private_token`). A RAY_AUTH_MODE or token the caller set is kept (the tests set the mode
    explicitly). Ray reads these when it is imported: call this before `import ray` (the CLI does)."""
    if os.environ.get("RAY_ADDRESS"):
        return
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    if os.environ["RAY_AUTH_MODE"] == "token" and not (os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")):
        os.environ["RAY_AUTH_TOKEN_PATH"] = str(private_token())


def connect(num_cpus: int | None = None) -> str:
    """Join the cluster in RAY_ADDRESS, or start an embedded local one. Returns a description."""
    embedded_auth_env()  # before the import: Ray reads its auth mode then
    import ray

    nvls_off_here()  # an embedded Ray's GCS, raylet, agents and workers inherit this environment
    if ray.is_initialized():
        return "ray (already connected)"
    address = os.environ.get("RAY_ADDRESS")
    if address:
        # the cluster's own authentication: RAY_AUTH_MODE and RAY_AUTH_TOKEN_PATH as its starter hands them
        # out (infra/services.sh: its env file; a job's driver inherits them); unset, Ray uses a token it finds
        # a loopback address names a one-machine cluster that listens on loopback only: keep it loopback
        # (Ray would turn 127.0.0.1 into this machine's outside address, where nothing listens)
        with _loopback_only() if _is_loopback(address) else contextlib.nullcontext():
            ray.init(address=address, logging_level="ERROR", log_to_driver=True)
        return f"ray cluster at {address}"
    embedded_auth_env()  # a no-op where the CLI did it already, before anything imported ray
    extra = {"_temp_dir": os.environ["SPECTUNE_RAY_TMPDIR"]} if os.environ.get("SPECTUNE_RAY_TMPDIR") else {}
    with _loopback_only():
        ray.init(
            address="local",
            num_cpus=num_cpus or os.cpu_count(),
            include_dashboard=False,
            logging_level="ERROR",
            log_to_driver=True,
            # gangs start their own actor processes: idle workers started up front only cost CPU (~1.4 s a start)
            _system_config={"prestart_worker_first_driver": False},
            _node_ip_address="127.0.0.1",
            **extra,
        )
    return f"embedded local ray ({ray.cluster_resources().get('CPU', 0):g} CPUs)"


def _is_loopback(address: str) -> bool:
    """RAY_ADDRESS as `host:port`, `ray://host:port` or `http://host:port`: is its host this machine's loopback?"""
    import ipaddress
    from urllib.parse import urlsplit

    host = urlsplit(address if "://" in address else f"//{address}").hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# Ray's switch for a one-machine cluster: without it Ray turns a node address of 127.0.0.1 into the
# machine's outside address, and its GCS, raylet and agents listen on every interface
ONE_MACHINE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


@contextlib.contextmanager
def _loopback_only():
    """An embedded Ray started inside binds every listener (GCS, raylet, object manager, agents, metrics,
    workers) to 127.0.0.1. Ray reads the switch at import (in this process: its constant is set too)
    and its processes inherit it; both are put back once they are started, so nothing else here sees it."""
    from ray._private import ray_constants

    saved_env, saved_const = os.environ.get(ONE_MACHINE_ENV), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[ONE_MACHINE_ENV] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved_const
        if saved_env is None:
            os.environ.pop(ONE_MACHINE_ENV, None)
        else:
            os.environ[ONE_MACHINE_ENV] = saved_env


def check_capacity(spec: GangSpec, res: Resources, nodes: list[dict] | None = None) -> None:
    """Fail fast, before anything launches, when no node can hold the gang. `nodes`: each node's
    resources (default: the live nodes of the connected Ray cluster)."""
    need_cpu = spec.world_size * res.cpus_per_worker
    need_gpu = spec.tp if spec.device == "cuda" else 0
    if nodes is None:
        import ray

        nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    if any(n.get("CPU", 0) >= need_cpu - 1e-9 and n.get("GPU", 0) >= need_gpu for n in nodes):
        return
    have = ", ".join(f"{n.get('CPU', 0):g} CPU/{n.get('GPU', 0):g} GPU" for n in nodes) or "no live nodes"
    what = f"{need_gpu} GPUs and " if need_gpu else ""
    raise PlacementError(
        f"a gang of tp={spec.tp}{' + drafter' if spec.has_drafter else ''} needs {what}{need_cpu:g} CPUs on one node; "
        f"the cluster's nodes have {have}"
    )


BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"  # one value per running kernel: shared by its containers
BOOT_ID_TIMEOUT_S = 60.0


def cluster_nodes() -> list[NodeInfo]:
    """The connected cluster's live nodes, with what tells which share a host (execution/slots.py's
    rule): address, `spectune.io/host` label and, where addresses alone leave several hosts, each
    unlabelled node's boot id (a zero-CPU task pinned to each; a node that does not answer within
    BOOT_ID_TIMEOUT_S keeps None and is grouped by its address alone)."""
    import ray

    alive = [n for n in ray.nodes() if n.get("Alive")]
    unlabelled = [n for n in alive if not (n.get("Labels") or {}).get(HOST_LABEL)]
    # nodes of one address are one host whatever their boot ids: ask only where addresses differ
    probe = len({n.get("NodeManagerAddress") for n in unlabelled}) > 1
    boots = boot_ids([n["NodeID"] for n in unlabelled], BOOT_ID_TIMEOUT_S) if probe else {}
    return [node_info(n, boots.get(n["NodeID"])) for n in alive]


def node_info(n: dict, boot_id: str | None = None) -> NodeInfo:
    """A node of `ray.nodes()` (alive or not) as the slots see it; `.host_name` names its host as the
    isolation rules do (its `spectune.io/host` label, else its hostname)."""
    return NodeInfo(
        id=n["NodeID"],
        host=n.get("NodeManagerHostname") or n.get("NodeManagerAddress", "?"),
        cpus=float((n.get("Resources") or {}).get("CPU", 0)),
        gpus=float((n.get("Resources") or {}).get("GPU", 0)),
        address=n.get("NodeManagerAddress", ""),
        boot_id=boot_id,
        host_label=(n.get("Labels") or {}).get(HOST_LABEL),
    )


def node_alive(node_id: str) -> bool:
    """The node counts as alive in the cluster and its raylet takes a connection. A killed raylet
    refuses at once, while the cluster itself marks the node dead only after its health checks time out."""
    import ray

    node = next((n for n in ray.nodes() if n["NodeID"] == node_id), None)
    if node is None or not node.get("Alive"):
        return False
    try:
        with socket.create_connection((node["NodeManagerAddress"], int(node["NodeManagerPort"])), timeout=5.0):
            return True
    except ConnectionRefusedError:
        return False  # nothing listens where its raylet did: gone
    except OSError:
        return True  # slow or unreachable for a moment is not dead: the cluster's own health checks decide


def boot_ids(node_ids: list[str], timeout_s: float) -> dict[str, str | None]:
    """Each node's kernel boot id, read on the node itself (None: no answer in time, or unreadable)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    def read(path: str) -> str | None:  # defined here: shipped by value, so the node needs no spectune import
        try:
            with open(path) as f:
                return f.read().strip() or None
        except OSError:
            return None

    task = ray.remote(num_cpus=0, max_retries=0)(read)
    refs = {i: task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(i, soft=False)).remote(BOOT_ID_PATH) for i in node_ids}
    ready, late = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
    for ref in late:
        ray.cancel(ref, force=True)
    out: dict[str, str | None] = {}
    for node_id, ref in refs.items():
        try:
            out[node_id] = ray.get(ref, timeout=0) if ref in ready else None
        except Exception:  # noqa: BLE001 - a node that died meanwhile: its boot id is unknown
            out[node_id] = None
    return out
