"""A Hugging Face hub on loopback for the tests of ``--fetch-configs``: the endpoints huggingface_hub's own
``snapshot_download``/``hf_hub_download`` call (a repository's file tree, ``resolve`` with HEAD and GET), serving
the files given, and recording which were downloaded. The machine running the tests never reaches the real hub."""
from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, List

COMMIT = "5b1e0c2a9f3d4e6b8a7c0d1e2f3a4b5c6d7e8f90"


class FakeHub:
    def __init__(self, repos: Dict[str, Dict[str, bytes]]):
        self.repos = repos
        self.downloaded: List[str] = []        # "repo/file" of each GET of a file
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status, body=b"", headers=None):
                self.send_response(status)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _route(self):
                path = self.path.split("?")[0]
                if path.startswith("/api/models/"):
                    parts = path[len("/api/models/"):].split("/")
                    repo = "/".join(parts[:2])
                    if repo not in hub.repos:
                        return self._send(404, b'{"error": "Repository not found"}',
                                          {"X-Error-Code": "RepoNotFound", "Content-Type": "application/json"})
                    if parts[2:3] == ["tree"]:
                        body = [{"type": "file", "path": f, "size": len(d), "oid": hashlib.sha1(d).hexdigest()}
                                for f, d in hub.repos[repo].items()]
                    else:
                        body = {"id": repo, "sha": COMMIT, "siblings": [{"rfilename": f} for f in hub.repos[repo]]}
                    return self._send(200, json.dumps(body).encode(), {"Content-Type": "application/json"})
                parts = path.lstrip("/").split("/")
                repo, name = "/".join(parts[:2]), "/".join(parts[4:])
                if parts[2:3] != ["resolve"] or repo not in hub.repos:
                    return self._send(404, b"", {"X-Error-Code": "RepoNotFound"})
                data = hub.repos[repo].get(name)
                if data is None:
                    return self._send(404, b"", {"X-Error-Code": "EntryNotFound"})
                if self.command == "GET":
                    hub.downloaded.append(f"{repo}/{name}")
                self._send(200, data, {"X-Repo-Commit": COMMIT, "ETag": f'"{hashlib.sha1(data).hexdigest()}"'})

            do_GET = do_HEAD = _route

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
