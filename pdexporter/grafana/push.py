"""Upsert the dashboards into a Grafana over its HTTP API (through grafana-client).

grafana-client is imported inside `push_dashboards` only: generating dashboards, and every other
command, must not pay for (or break on) it. Each failure a user can act on becomes one line:
wrong credentials (401), a token without the rights (403), a Grafana that cannot be reached.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pdexporter import __version__
from pdexporter._internal.redact import remember_secret
from pdexporter._internal.text import body_reason, shorten
from pdexporter._internal.urls import check_http_url
from pdexporter.errors import ConfigError, PdexporterError

__all__ = [
    "DEFAULT_FOLDER", "GrafanaAuthError", "GrafanaError", "GrafanaUnreachable", "PushedDashboard", "ROOT_FOLDERS",
    "push_dashboards", "read_token", "redact",
]

DEFAULT_FOLDER = "pdexporter"
ROOT_FOLDERS = ("", "General")  # Grafana's root: no folderUid


class GrafanaError(PdexporterError):
    """Grafana answered, but refused what we sent."""

    exit_code = 5


class GrafanaAuthError(GrafanaError):
    """401 (bad or missing credentials) or 403 (credentials without the needed rights)."""


class GrafanaUnreachable(GrafanaError):
    """Connection refused, DNS failure, TLS failure or timeout: exit 3, as an unreachable engine."""

    exit_code = 3


@dataclass(frozen=True)
class PushedDashboard:
    uid: str
    title: str
    url: str
    version: int | None
    folder_uid: str | None


def read_token(token_file: Path | None) -> str | None:
    if token_file is None:
        return None
    try:
        token = token_file.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"--token-file {token_file}: cannot read it ({exc.strerror or exc})") from None
    if not token:
        raise ConfigError(f"--token-file {token_file}: the file is empty")
    remember_secret(token)  # never printed, whatever Grafana's answer quotes (`_internal.redact`)
    return token


def redact(url: str) -> str:
    """The URL without a password, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def push_dashboards(
    grafana_url: str,
    dashboards: Mapping[str, Mapping[str, Any]],
    *,
    token: str | None = None,
    folder: str = DEFAULT_FOLDER,
    timeout: float = 10.0,
) -> list[PushedDashboard]:
    """Create the folder if missing, then create or overwrite each dashboard by its uid."""
    from grafana_client import GrafanaApi
    from grafana_client.client import (
        GrafanaClientError,
        GrafanaException,
        GrafanaTimeoutError,
        GrafanaUnauthorizedError,
    )

    check_http_url(grafana_url, "--grafana-url")  # one line, the password hidden (and remembered)
    shown = redact(grafana_url)
    api = GrafanaApi.from_url(grafana_url.rstrip("/"), credential=token, timeout=timeout)

    def call(what: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except GrafanaUnauthorizedError:
            raise GrafanaAuthError(
                f"Grafana at {shown} rejected the credentials (HTTP 401) while {what}: check --token-file "
                "(a service-account token) or the user:password in the URL"
            ) from None
        except GrafanaTimeoutError as exc:
            raise GrafanaUnreachable(
                f"Grafana at {shown} did not answer within {timeout:g} s while {what}: {exc}"
            ) from None
        except GrafanaClientError as exc:
            if exc.status_code == 403:
                raise GrafanaAuthError(
                    f"Grafana at {shown} denied {what} (HTTP 403): the token needs the Editor role "
                    f"(folders:create, dashboards:write): {_message(exc)}"
                ) from None
            raise GrafanaError(f"Grafana at {shown} refused {what} (HTTP {exc.status_code}): {_message(exc)}") from None
        except GrafanaException as exc:
            if exc.status_code in (0, None):
                raise GrafanaUnreachable(f"cannot reach Grafana at {shown} while {what}: {exc}") from None
            raise GrafanaError(f"Grafana at {shown} failed {what} (HTTP {exc.status_code}): {_message(exc)}") from None
        except OSError as exc:  # the HTTP library's connection errors (refused, DNS, TLS) derive from OSError
            raise GrafanaUnreachable(f"cannot reach Grafana at {shown}: {_reason(exc)}") from None

    folder_uid = None if folder in ROOT_FOLDERS else _ensure_folder(call, api, folder, shown)
    pushed: list[PushedDashboard] = []
    for board in dashboards.values():
        payload: dict[str, Any] = {
            "dashboard": {**board, "id": None},  # null id + known uid + overwrite = upsert by uid
            "overwrite": True,
            "message": f"pushed by pdexporter {__version__}",
        }
        if folder_uid is not None:
            payload["folderUid"] = folder_uid
        answer = call(f"saving dashboard {board['uid']!r}", api.dashboard.update_dashboard, payload) or {}
        pushed.append(
            PushedDashboard(
                uid=str(answer.get("uid", board["uid"])),
                title=str(board.get("title", "")),
                url=str(answer.get("url", "")),
                version=answer.get("version"),
                folder_uid=folder_uid,
            )
        )
    return pushed


def _ensure_folder(call: Any, api: Any, title: str, shown: str) -> str:
    folders = call("listing folders", api.folder.get_all_folders) or []
    if not isinstance(folders, list):  # a 200 with a page (text/html) instead of the API's JSON
        raise GrafanaError(f"{shown} answered the folder list with "
                           f"{body_reason(str(folders))}, not Grafana's JSON: is --grafana-url Grafana's base URL?")
    for existing in folders:
        if existing.get("title") == title:
            return str(existing["uid"])
    created = call(f"creating folder {title!r}", api.folder.create_folder, title)
    return str(created["uid"])


def _message(exc: Any) -> str:
    """Grafana's own message, or one short line of whatever else answered (an HTML page, never
    its markup)."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict) and response.get("message"):
        return shorten(str(response["message"]))
    if isinstance(response, str) and response.strip():
        return body_reason(response)
    return body_reason(str(exc))


def _reason(exc: OSError) -> str:
    text = " ".join(str(exc).split())
    for marker in ("Connection refused", "Name or service not known", "No route to host", "timed out",
                   "Temporary failure in name resolution", "CERTIFICATE_VERIFY_FAILED"):
        if marker in text:
            return marker
    return text
