"""`pdexporter dashboards push` against GrafanaApiDouble, a TEST DOUBLE of Grafana's HTTP API.

No Grafana binary can be installed here (not in Debian 12, PyPI or npm); the double imitates the
API calls push makes, including Grafana's 401/403/409/412 answers (see grafana_double.py).
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pdexporter.errors import ConfigError
from pdexporter.grafana import build_all
from pdexporter.grafana.push import GrafanaAuthError, GrafanaUnreachable, push_dashboards, read_token
from tests.helpers import free_port
from tests.integration.grafana.grafana_double import GrafanaApiDouble

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def grafana() -> Iterator[GrafanaApiDouble]:
    with GrafanaApiDouble() as double:
        yield double


def test_push_creates_folder_and_dashboards_then_upserts_by_uid(grafana: GrafanaApiDouble) -> None:
    boards = build_all()
    first = push_dashboards(grafana.url, boards, token="editor-token", folder="pdexporter")
    assert [p.uid for p in first] == ["pdexporter-live", "pdexporter-interference-map"]
    assert [p.version for p in first] == [1, 1]
    (folder,) = grafana.state.folders.values()
    assert folder["title"] == "pdexporter"
    for board in boards.values():
        stored = grafana.state.dashboards[board["uid"]]
        assert stored["folderUid"] == folder["uid"]
        assert stored["dashboard"]["panels"] == board["panels"]
        assert stored["dashboard"]["templating"] == board["templating"]
    ids = {uid: s["dashboard"]["id"] for uid, s in grafana.state.dashboards.items()}

    second = push_dashboards(grafana.url, boards, token="editor-token", folder="pdexporter")
    assert [p.version for p in second] == [2, 2]
    assert len(grafana.state.folders) == 1, "an existing folder must be reused, not duplicated"
    assert {uid: s["dashboard"]["id"] for uid, s in grafana.state.dashboards.items()} == ids
    assert second[0].url == "/d/pdexporter-live/pdexporter-live-interference-probes"


def test_root_folder_needs_no_folder(grafana: GrafanaApiDouble) -> None:
    push_dashboards(grafana.url, build_all(), token="editor-token", folder="General")
    assert not grafana.state.folders
    assert all(s["folderUid"] == "" for s in grafana.state.dashboards.values())
    assert ("POST", "/api/folders") not in grafana.state.requests


def test_basic_auth_in_the_url(grafana: GrafanaApiDouble) -> None:
    url = grafana.url.replace("http://", "http://admin:s3cret@")
    assert len(push_dashboards(url, build_all(), folder="Team A")) == 2
    with pytest.raises(GrafanaAuthError) as info:
        push_dashboards(url.replace("s3cret", "wrong-pw"), build_all())
    assert "wrong-pw" not in str(info.value) and "admin:***@" in str(info.value)


def test_bad_token_is_one_clear_line(grafana: GrafanaApiDouble) -> None:
    with pytest.raises(GrafanaAuthError) as info:
        push_dashboards(grafana.url, build_all(), token="nope")
    text = str(info.value)
    assert "HTTP 401" in text and "--token-file" in text and grafana.url in text and "\n" not in text
    assert not grafana.state.dashboards


def test_viewer_token_is_refused_with_403(grafana: GrafanaApiDouble) -> None:
    with pytest.raises(GrafanaAuthError, match=r"HTTP 403.*Editor.*folders:create"):
        push_dashboards(grafana.url, build_all(), token="viewer-token")
    with pytest.raises(GrafanaAuthError, match=r"HTTP 403.*dashboards:create"):
        push_dashboards(grafana.url, build_all(), token="viewer-token", folder="General")


def test_unreachable_grafana() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(
        GrafanaUnreachable, match=r"cannot reach Grafana at http://127\.0\.0\.1:\d+: Connection refused"
    ):
        push_dashboards(url, build_all(), token="t", timeout=2)


def test_silent_grafana_times_out() -> None:
    with socket.socket() as listener:  # accepts connections into the backlog, never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        with pytest.raises(GrafanaUnreachable, match="did not answer within 0.5 s|timed out"):
            push_dashboards(url, build_all(), token="t", timeout=0.5)


def test_bad_url_and_token_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--grafana-url"):
        push_dashboards("grafana:3000", build_all())
    with pytest.raises(ConfigError, match="cannot read"):
        read_token(tmp_path / "missing")
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="empty"):
        read_token(tmp_path / "empty")
    (tmp_path / "tok").write_text("editor-token\n")
    assert read_token(tmp_path / "tok") == "editor-token"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pdexporter", "dashboards", "push", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.e2e
def test_cli_push_and_its_errors(grafana: GrafanaApiDouble, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("editor-token\n")
    ok = _cli("--grafana-url", grafana.url, "--token-file", str(token), "--folder", "LLM")
    assert ok.returncode == 0, ok.stderr
    assert "pushed pdexporter-live" in ok.stderr and "pushed pdexporter-interference-map" in ok.stderr
    assert [f["title"] for f in grafana.state.folders.values()] == ["LLM"]

    token.write_text("revoked\n")
    denied = _cli("--grafana-url", grafana.url, "--token-file", str(token))
    assert denied.returncode == 5
    lines = denied.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pdexporter: error: Grafana at") and "401" in lines[0]

    gone = _cli("--grafana-url", f"http://127.0.0.1:{free_port()}", "--token-file", str(token), "--timeout", "2")
    assert gone.returncode == 3 and "cannot reach Grafana" in gone.stderr and "Traceback" not in gone.stderr
