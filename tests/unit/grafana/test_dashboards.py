"""The dashboards the code builds: committed copies not stale, datasource by variable, sound layout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from pdexporter.cli import app
from pdexporter.exporter.metrics import GRID_LABELS, all_series_names
from pdexporter.grafana import DASHBOARDS, build_all, render, stale_files
from pdexporter.grafana.panels import GRID_WIDTH
from pdexporter.grafana.promql import panel_queries, series_names, variable_queries

ROOT = Path(__file__).resolve().parents[3]
COPIES = [ROOT / "dashboards", ROOT / "helm" / "pdexporter" / "dashboards"]


@pytest.mark.parametrize("directory", COPIES, ids=lambda p: str(p.relative_to(ROOT)))
def test_committed_dashboards_match_the_code(directory: Path) -> None:
    """Regenerate in memory; fail if a committed file (or the chart's copy) is stale or missing."""
    assert stale_files(directory) == [], "run `python -m pdexporter dashboards generate` and commit"
    extra = {p.name for p in directory.glob("*.json")} - set(DASHBOARDS)
    assert not extra, f"{directory} holds dashboards no builder makes: {sorted(extra)}"


def test_stale_check_catches_an_edit(tmp_path: Path) -> None:
    for name, board in build_all().items():
        (tmp_path / name).write_text(render(board))
    assert stale_files(tmp_path) == []
    first = next(iter(DASHBOARDS))
    (tmp_path / first).write_text((tmp_path / first).read_text().replace("TPOT", "TPOT!", 1))
    assert stale_files(tmp_path) == [str(tmp_path / first)]


def test_generate_check_cli_exits_nonzero_on_stale(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["dashboards", "generate", "--out", str(tmp_path), "--chart", str(tmp_path / "none")])
    assert result.exit_code != 0  # a --chart that is not a directory is an error (not silently skipped)
    result = runner.invoke(app, ["dashboards", "generate", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(DASHBOARDS)
    assert runner.invoke(app, ["dashboards", "generate", "--out", str(tmp_path), "--check"]).exit_code == 0
    (tmp_path / "pdexporter-live.json").write_text("{}")
    assert runner.invoke(app, ["dashboards", "generate", "--out", str(tmp_path), "--check"]).exit_code == 1


def test_render_is_deterministic_and_round_trips() -> None:
    for board in build_all().values():
        text = render(board)
        assert text == render(json.loads(text))
        assert text.endswith("}\n")


def _datasources(node: Any) -> list[dict[str, Any]]:
    found = []
    if isinstance(node, dict):
        if isinstance(node.get("datasource"), dict):
            found.append(node["datasource"])
        for value in node.values():
            found += _datasources(value)
    elif isinstance(node, list):
        for value in node:
            found += _datasources(value)
    return found


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_datasource_is_the_template_variable_never_a_uid(name: str) -> None:
    board = build_all()[name]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for ds in _datasources(board):
        if ds.get("type") == "grafana":  # the built-in annotation source
            continue
        assert ds == {"type": "prometheus", "uid": "${datasource}"}
    assert "__inputs" not in board


def test_uids_are_stable_and_match_file_names() -> None:
    boards = build_all()
    assert {name: b["uid"] for name, b in boards.items()} == {
        "pdexporter-live.json": "pdexporter-live",
        "pdexporter-interference-map.json": "pdexporter-interference-map",
    }
    assert all(len(b["uid"]) <= 40 for b in boards.values())  # Grafana's uid limit


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_layout_ids_and_grid(name: str) -> None:
    panels = build_all()[name]["panels"]
    assert [p["id"] for p in panels] == list(range(1, len(panels) + 1))
    occupied: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= GRID_WIDTH, p["title"]
        cells = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & occupied, f"{p['title']} overlaps another panel"
        occupied |= cells
        assert p.get("description") or p["type"] == "row", f"{p['title']}: no description"


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_every_expression_names_only_exporter_series(name: str) -> None:
    board = build_all()[name]
    known = set(all_series_names())
    queries = panel_queries(board)
    assert queries
    for q in queries:
        names = series_names(q.expr)
        assert names and names <= known, (q.where, q.expr, names - known)
    for var in variable_queries(board):
        assert series_names(var.selector) <= known


def test_live_dashboard_covers_the_issue() -> None:
    board = build_all()["pdexporter-live.json"]
    exprs = " ".join(q.expr for q in panel_queries(board))
    for q in ("0.5", "0.9", "0.99"):
        assert f"histogram_quantile({q}, sum by (phase, le) (rate(pdexporter_probe_tpot_seconds_bucket" in exprs
    used = {n for q in panel_queries(board) for n in series_names(q.expr)}
    for series in ("pdexporter_window_tpot_penalty_seconds", "pdexporter_window_tpot_penalty_ratio",
                   "pdexporter_prefill_duration_seconds_bucket", "pdexporter_window_slow_steps",
                   "pdexporter_window_expected_chunks", "pdexporter_engine_requests_running",
                   "pdexporter_engine_requests_waiting", "pdexporter_engine_kv_cache_usage_ratio", "pdexporter_up",
                   "pdexporter_engine_scrape_success", "pdexporter_engine_scrape_duration_seconds",
                   "pdexporter_errors_total"):
        assert series in used, series


def test_live_dashboard_shows_the_live_thresholds_with_their_intervals() -> None:
    """Issue 33: the router threshold vs time, its interval's ends, the events behind it and its age."""
    board = build_all()["pdexporter-live.json"]
    exprs = [q.expr for q in panel_queries(board)]
    for bound in ("central", "low", "high"):
        assert any('pdexporter_offload_threshold_tokens{' in e and f'bound="{bound}"' in e for e in exprs), bound
    assert any("pdexporter_offload_threshold_events" in e for e in exprs)
    assert any(e.startswith("time() - max(pdexporter_offload_threshold_timestamp_seconds") for e in exprs)
    assert "decodes" in {v["name"] for v in board["templating"]["list"]}


def test_interference_map_is_a_p_by_d_matrix_per_chunk_size() -> None:
    board = build_all()["pdexporter-interference-map.json"]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["chunk_size"]["definition"] == "label_values(pdexporter_window_tpot_penalty_ratio, chunk_size)"
    heat = next(p for p in board["panels"] if p["title"].startswith("Penalty ratio"))
    assert heat["type"] == "table"
    assert heat["targets"][0]["format"] == "table" and heat["targets"][0]["instant"] is True
    assert 'chunk_size="$chunk_size"' in heat["targets"][0]["expr"]
    assert "pdexporter_window_tpot_penalty_ratio" in heat["targets"][0]["expr"]
    steps = [t["id"] for t in heat["transformations"]]
    assert steps == ["convertFieldType", "sortBy", "sortBy", "groupingToMatrix", "organize"]
    pivot = heat["transformations"][3]["options"]
    assert (pivot["rowField"], pivot["columnField"], pivot["valueField"]) == ("decode_batch_size",
                                                                              "new_prefill_tokens", "Value")
    assert {pivot["rowField"], pivot["columnField"]} <= set(GRID_LABELS)
    # stable sort: secondary key (P) first, then primary (D)
    assert [t["options"]["sort"][0]["field"] for t in heat["transformations"][1:3]] == ["new_prefill_tokens",
                                                                                        "decode_batch_size"]
    assert heat["fieldConfig"]["defaults"]["custom"]["cellOptions"]["type"] == "color-background"
    assert heat["fieldConfig"]["defaults"]["color"]["mode"].startswith("continuous-")
