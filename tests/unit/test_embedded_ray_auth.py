"""The embedded Ray asks for a token too (loopback is every local user): with no RAY_ADDRESS and no
RAY_AUTH_MODE set, spectune turns Ray's token auth on with a token file only this user can read; what
the caller set (a mode, a token, a cluster) is kept."""

from __future__ import annotations

import stat

from orchestrator.execution.cluster import embedded_auth_env


def test_token_auth_with_a_private_token(tmp_path, monkeypatch):
    for var in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SPECTUNE_HOME", str(tmp_path))
    embedded_auth_env()
    import os

    path = tmp_path / "ray-token"
    assert os.environ["RAY_AUTH_MODE"] == "token" and os.environ["RAY_AUTH_TOKEN_PATH"] == str(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(path.read_text()) == 64
    token = path.read_text()
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH")
    embedded_auth_env()
    assert path.read_text() == token  # made once: a second driver of the same home uses the same token


def test_what_the_caller_set_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECTUNE_HOME", str(tmp_path))
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    embedded_auth_env()
    import os

    assert os.environ["RAY_AUTH_MODE"] == "disabled" and "RAY_AUTH_TOKEN_PATH" not in os.environ
    monkeypatch.delenv("RAY_AUTH_MODE")
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")  # a cluster: its own auth, as its starter hands it out
    embedded_auth_env()
    assert "RAY_AUTH_MODE" not in os.environ and not (tmp_path / "ray-token").exists()


def test_drivers_starting_at_once_agree_on_one_token(tmp_path, monkeypatch):
    """Six processes make the token of a fresh home at once: every one reads the same token."""
    import multiprocessing as mp

    monkeypatch.setenv("SPECTUNE_HOME", str(tmp_path))
    ctx = mp.get_context("fork")
    barrier, queue = ctx.Barrier(6), ctx.Queue()

    def one() -> None:
        from orchestrator.execution.cluster import private_token

        barrier.wait()
        queue.put(private_token().read_text())

    procs = [ctx.Process(target=one) for _ in range(6)]
    for p in procs:
        p.start()
    tokens = {queue.get(timeout=60) for _ in procs}
    for p in procs:
        p.join(timeout=60)
    assert len(tokens) == 1 and all(p.exitcode == 0 for p in procs)
    assert [f.name for f in tmp_path.iterdir()] == ["ray-token"]  # no temporary file left behind
