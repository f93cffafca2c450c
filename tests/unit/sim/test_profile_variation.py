"""What moves between GPU campaigns, carried by the embedded engine's predictions (issue 30 item 2):
the profile of the engine it was measured on holds a copy of `pdexporter validate`'s campaign
variation, and a table the embedded engine made with that profile carries it into its intervals,
as `export-table --campaign-variation` does for a measured table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdexporter.analysis.campaigns import load_variation
from pdexporter.analysis.decision_eval import held_out_text
from pdexporter.errors import ConfigError
from pdexporter.sim.modelconfig import load_config, profile_from_config
from pdexporter.sim.profile import load_profile, parse_profile
from tests.helpers import run_cli

ROOT = Path(__file__).resolve().parents[3]
MEASURED_ON = "h200-qwen3-coder-30b-a3b"
SWEEP = "grid: {chunk_sizes: [2048], decode_batch_sizes: [1, 4], new_prefill_tokens: [512, 4096]}\nreps: 2\n"


def test_the_shipped_copy_is_what_validate_measured() -> None:
    """Re-validating without copying it over (`scripts/profile_variation.py`) fails here."""
    measured = load_profile(MEASURED_ON).campaign_variation
    assert measured is not None
    held_out = ROOT / measured.source
    variation, _ = load_variation(held_out)
    assert measured.arms() == {arm: variation[arm] for arm in ("colocated", "offloaded")}
    assert len(measured.colocated.campaigns) >= 14 if measured.colocated else False


def test_a_profile_made_from_it_borrows_it_and_says_from_whom() -> None:
    """A projection (another model, another GPU) and the shipped profiles made from the measured one carry
    its variation as borrowed: their own engine was never measured across campaigns."""
    measured = load_profile(MEASURED_ON).campaign_variation
    assert measured is not None and measured.borrowed_from is None
    config, source = load_config("qwen3-14b")
    projected = profile_from_config(config, "H100", model_name="qwen3-14b", source=source,
                                    carry_from=["h200-llama-3.1-8b-instruct", MEASURED_ON])
    lent = projected.campaign_variation
    assert lent is not None and lent.borrowed_from == MEASURED_ON and lent.arms() == measured.arms()
    assert f"borrowed_from: {MEASURED_ON}" in projected.to_yaml()
    shipped = {p.stem: load_profile(p).campaign_variation for p in (ROOT / "pdexporter/sim/profiles").glob("*.yaml")}
    borrowing = {name for name, v in shipped.items() if v is not None and v.borrowed_from == MEASURED_ON}
    assert borrowing == {"h200-llama-3.1-8b-instruct", "h200-qwen2.5-32b-instruct", "h200-qwen3-14b",
                         "h20-qwen3-coder-30b-a3b"}
    assert all(shipped[n].arms() == measured.arms() for n in borrowing)  # type: ignore[union-attr]
    # SGLang's engine is not the one it was measured on: none
    assert shipped["h200-sglang0.5.15-qwen3-coder-30b-a3b"] is None


def test_no_reference_with_one_lends_none() -> None:
    config, source = load_config("qwen3-14b")
    bare = load_profile("h200-llama-3.1-8b-instruct").model_copy(update={"campaign_variation": None})
    projected = profile_from_config(config, "H200", model_name="qwen3-14b", source=source, carry_from=[bare])
    assert projected.campaign_variation is None and "campaign_variation" not in projected.to_yaml()


def test_a_bad_copy_is_one_line_naming_the_field() -> None:
    data = load_profile(MEASURED_ON).model_dump(mode="json")
    data["campaign_variation"]["colocated"]["by_regime"]["launch"] = -0.1
    line = r"^p.yaml: campaign_variation.colocated.by_regime.launch: must be >= 0.0 \(got -0.1\)$"
    with pytest.raises(ConfigError, match=line):
        parse_profile(data, source="p.yaml")


def _predicted(tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[dict, str]:  # type: ignore[type-arg]
    sweep = tmp_path / "s.yaml"
    sweep.write_text(SWEEP)
    code, _, err = run_cli(capsys, "sim", "sweep", str(sweep), "--out", str(tmp_path / "sim"), *extra)
    assert code == 0, err
    code, _, err = run_cli(capsys, "export-table", str(tmp_path / "sim"), "--out", str(tmp_path / "t"), "--no-plots")
    assert code == 0, err
    return json.loads((tmp_path / "t" / "decision.json").read_text()), err


def test_the_embedded_engines_table_carries_its_profiles_variation(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    decision, err = _predicted(tmp_path, capsys)
    carried = decision["campaign_variation"]
    assert carried["source"].startswith(f"profile {MEASURED_ON}, measured on the real engine")
    assert carried["colocated"] == load_profile(MEASURED_ON).campaign_variation.arms()["colocated"]  # type: ignore[union-attr]
    assert len(decision["replicates"]["campaign"]) == len(decision["replicates"]["model"])
    compute = carried["colocated"]["by_regime"]["compute"]
    assert f"intervals carry the campaign-to-campaign variation (log sd compute {compute:.2f}" in err
    assert f"of profile {MEASURED_ON}" in held_out_text(decision)


def test_a_profile_without_one_says_its_intervals_are_the_repetitions_only(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    bare = load_profile("h200-qwen3-14b").model_copy(update={"name": "bare", "campaign_variation": None})
    (tmp_path / "bare.yaml").write_text(bare.to_yaml())
    decision, err = _predicted(tmp_path, capsys, "--profile", str(tmp_path / "bare.yaml"))
    assert "campaign_variation" not in decision and "campaign" not in decision["replicates"]
    assert "campaign-to-campaign" not in err
    assert held_out_text(decision).startswith("intervals: this campaign's repetitions only")


def test_the_committed_coverage_of_the_embedded_engines_intervals_is_what_it_measures(tmp_path: Path) -> None:
    """`results/h200-held-out/sim_coverage.md` (the embedded engine's predictions of 13 campaigns' points
    with the variation its profile carries: MAPE and the share inside the 90 % band) is what
    `scripts/sim_coverage.py` writes from the committed held_out.csv and the shipped profile; a
    change to either, the window maths or the engine leaves it stale and fails here."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("sim_coverage", ROOT / "scripts" / "sim_coverage.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--held-out", str(ROOT / "results/h200-held-out/held_out.csv"), "--out", str(tmp_path)]) == 0
    fresh = (tmp_path / "sim_coverage.md").read_text()
    assert fresh == (ROOT / "results/h200-held-out/sim_coverage.md").read_text()
    every = next(line for line in fresh.splitlines() if line.startswith("| all |")).split(" | ")
    assert int(every[1]) > 1000 and every[-2].endswith("%")  # nested coverage, e.g. "90%"


def test_a_borrowing_profiles_table_says_whose_variation_it_carries(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    decision, err = _predicted(tmp_path, capsys, "--profile", "h200-qwen3-14b")
    carried = decision["campaign_variation"]
    assert carried["source"].startswith(f"profile h200-qwen3-14b, borrowed from {MEASURED_ON} (measured on its")
    assert carried["colocated"] == load_profile(MEASURED_ON).campaign_variation.arms()["colocated"]  # type: ignore[union-attr]
    assert "borrowed from" in err
