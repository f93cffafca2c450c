"""GrafanaApiDouble: a TEST DOUBLE of Grafana's HTTP API, for `pdexporter dashboards push`.

No Grafana can run here: Debian 12 does not package it, and neither PyPI nor npm ships a runnable
Grafana server. This double imitates the part of Grafana 10/11's API that push uses, with its
status codes and message shapes: bearer tokens (service accounts) with Viewer/Editor/Admin roles
and basic auth, 401 for bad credentials, 403 for a role without the permission, folders
(GET/POST /api/folders, 409 on a duplicate title), dashboards (POST /api/dashboards/db with
overwrite/version-mismatch semantics, GET /api/dashboards/uid/UID), /api/health.
"""

from __future__ import annotations

import base64
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ROLES = {"Viewer": 0, "Editor": 1, "Admin": 2}


@dataclass
class GrafanaState:
    tokens: dict[str, str] = field(default_factory=lambda: {"editor-token": "Editor", "viewer-token": "Viewer"})
    users: dict[tuple[str, str], str] = field(default_factory=lambda: {("admin", "s3cret"): "Admin"})
    folders: dict[str, dict[str, Any]] = field(default_factory=dict)  # uid -> folder
    dashboards: dict[str, dict[str, Any]] = field(default_factory=dict)  # uid -> {"dashboard", "folderUid"}
    requests: list[tuple[str, str]] = field(default_factory=list)
    next_id: int = 1

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1


def _slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


class _Handler(BaseHTTPRequestHandler):
    state: GrafanaState  # set on the subclass made per server

    def log_message(self, *args: Any) -> None:  # keep test output clean
        pass

    # --- plumbing -------------------------------------------------------------------------------
    def _send(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length) or b"null")

    def _role(self) -> str | None:
        header = self.headers.get("Authorization", "")
        if header.startswith("Bearer "):
            return self.state.tokens.get(header[len("Bearer "):])
        if header.startswith("Basic "):
            user, _, password = base64.b64decode(header[6:]).decode().partition(":")
            return self.state.users.get((user, password))
        return None

    def _authorize(self, needed: str, permission: str) -> bool:
        role = self._role()
        if role is None:
            if self.headers.get("Authorization", "").startswith("Bearer "):
                self._send(401, {"message": "Invalid API key", "messageId": "api-key.invalid", "statusCode": 401,
                                 "traceID": ""})
            else:
                self._send(401, {"message": "Unauthorized"})
            return False
        if ROLES[role] < ROLES[needed]:
            self._send(403, {"accessErrorId": "ACE0123456789", "title": "Access denied",
                             "message": "You'll need additional permissions to perform this action. "
                                        f"Permissions needed: {permission}"})
            return False
        return True

    # --- routes ---------------------------------------------------------------------------------
    def do_GET(self) -> None:
        self.state.requests.append(("GET", self.path))
        if self.path == "/api/health":
            return self._send(200, {"commit": "double", "database": "ok", "version": "11.3.0-test-double"})
        if not self._authorize("Viewer", "folders:read"):
            return None
        if self.path.split("?")[0] == "/api/folders":
            return self._send(200, [{"id": f["id"], "uid": f["uid"], "title": f["title"]}
                                    for f in self.state.folders.values()])
        match = re.fullmatch(r"/api/dashboards/uid/([^/?]+)", self.path)
        if match:
            stored = self.state.dashboards.get(match.group(1))
            if stored is None:
                return self._send(404, {"message": "Dashboard not found"})
            board = stored["dashboard"]
            return self._send(200, {"dashboard": board, "meta": {
                "folderUid": stored["folderUid"], "slug": _slug(board["title"]),
                "url": f"/d/{board['uid']}/{_slug(board['title'])}", "version": board["version"]}})
        return self._send(404, {"message": "Not found"})

    def do_POST(self) -> None:
        self.state.requests.append(("POST", self.path))
        if self.path == "/api/folders":
            if not self._authorize("Editor", "folders:create"):
                return None
            body = self._body()
            title = (body or {}).get("title", "")
            if not title:
                return self._send(400, {"message": "folder title cannot be empty"})
            if any(f["title"] == title for f in self.state.folders.values()):
                return self._send(409, {"message": "a folder with the same name already exists"})
            uid = body.get("uid") or f"f{self.state.next_id:08d}"
            folder = {
                "id": self.state.new_id(),
                "uid": uid,
                "title": title,
                "url": f"/dashboards/f/{uid}/{_slug(title)}",
                "version": 1,
            }
            self.state.folders[uid] = folder
            return self._send(200, folder)
        if self.path == "/api/dashboards/db":
            if not self._authorize("Editor", "dashboards:create"):
                return None
            return self._save_dashboard(self._body() or {})
        return self._send(404, {"message": "Not found"})

    def _save_dashboard(self, body: dict[str, Any]) -> None:
        board = dict(body.get("dashboard") or {})
        if not board.get("title", "").strip():
            return self._send(400, {"message": "Dashboard title cannot be empty", "status": "empty-name"})
        folder_uid = body.get("folderUid") or ""
        if folder_uid and folder_uid not in self.state.folders:
            return self._send(400, {"message": "folder not found", "status": "folder-not-found"})
        uid = board.get("uid") or f"d{self.state.next_id:08d}"
        existing = self.state.dashboards.get(uid)
        if board.get("id") is not None and (existing is None or existing["dashboard"]["id"] != board["id"]):
            return self._send(404, {"message": "Dashboard not found", "status": "not-found"})
        if existing and not body.get("overwrite") and board.get("version") != existing["dashboard"]["version"]:
            return self._send(412, {"message": "The dashboard has been changed by someone else",
                                    "status": "version-mismatch"})
        board["uid"] = uid
        board["id"] = existing["dashboard"]["id"] if existing else self.state.new_id()
        board["version"] = existing["dashboard"]["version"] + 1 if existing else 1
        self.state.dashboards[uid] = {"dashboard": board, "folderUid": folder_uid}
        slug = _slug(board["title"])
        return self._send(200, {"id": board["id"], "uid": uid, "url": f"/d/{uid}/{slug}", "status": "success",
                                "version": board["version"], "slug": slug, "folderUid": folder_uid})


class GrafanaApiDouble:
    """Start with `with GrafanaApiDouble() as grafana:`; `grafana.url`, `grafana.state`."""

    def __init__(self) -> None:
        self.state = GrafanaState()
        handler = type("Handler", (_Handler,), {"state": self.state})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> GrafanaApiDouble:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
