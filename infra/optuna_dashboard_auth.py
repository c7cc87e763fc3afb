"""optuna-dashboard behind HTTP basic auth, as infra/services.sh starts it. optuna-dashboard has no
login of its own and offers a delete button on every study; on a shared machine 127.0.0.1 is every
local user, so each request must carry the user and password of the MLflow server beside it
(MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD of this process's environment, never a command
line). A browser asks for them once; anything else gets 401.

    MLFLOW_TRACKING_USERNAME=... MLFLOW_TRACKING_PASSWORD=... \
        python infra/optuna_dashboard_auth.py STORAGE_URL --host 127.0.0.1 --port 8080
"""

from __future__ import annotations

import argparse
import base64
import binascii
import hmac
import os
import sys
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIServer, make_server

WSGIApp = Callable[[dict, Callable], Iterable[bytes]]


def basic_auth(app: WSGIApp, username: str, password: str, realm: str = "spectune") -> WSGIApp:
    """`app` for requests whose Authorization header names `username` and `password`; 401 for the rest."""
    expected = f"{username}:{password}".encode()

    def guarded(environ: dict, start_response: Callable) -> Iterable[bytes]:
        scheme, _, encoded = environ.get("HTTP_AUTHORIZATION", "").partition(" ")
        try:
            given = base64.b64decode(encoded.strip(), validate=True)
        except (binascii.Error, ValueError):
            given = b""
        if scheme.lower() == "basic" and hmac.compare_digest(given, expected):
            return app(environ, start_response)
        body = b"401 Unauthorized: optuna-dashboard needs the MLflow user and password of infra/services.sh's env file\n"
        headers = [
            ("WWW-Authenticate", f'Basic realm="{realm}", charset="UTF-8"'),
            ("Content-Type", "text/plain; charset=utf-8"),
            ("Content-Length", str(len(body))),
        ]
        start_response("401 Unauthorized", headers)
        return [body]

    return guarded


class ThreadedWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("storage", help="Optuna storage URL")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args()
    username, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    if not username or not password:
        print("optuna_dashboard_auth: MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD must be set", file=sys.stderr)
        return 2
    import optuna_dashboard

    app = basic_auth(optuna_dashboard.wsgi(args.storage), username, password)
    with make_server(args.host, args.port, app, server_class=ThreadedWSGIServer) as httpd:
        print(f"optuna-dashboard (basic auth) on http://{args.host}:{args.port}", file=sys.stderr, flush=True)
        httpd.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
