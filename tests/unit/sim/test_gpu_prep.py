"""What the dense model's GPU run is made of: the model folder it writes, the sweep it runs, the
projection it will be compared with (scripts/gpu/dense-h200.sh, results/...-llama-3.1-8b-instruct/PLAN.md)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
from pathlib import Path

import pytest

from pdexporter.sim.modelconfig import load_config
from pdexporter.sim.profile import load_profile
from pdexporter.sweep.spec import load_sweep
from tests.helpers import REPO, gpu_script

DENSE = REPO / "sweeps" / "h200-dense-llama-3.1-8b.yaml"


def _make_model():  # type: ignore[no-untyped-def]
    return gpu_script("make_model")


def test_make_model_writes_a_dummy_weight_folder_from_a_shipped_config(tmp_path: Path):
    out = tmp_path / "llama-3.1-8b-instruct"
    assert _make_model().main([str(out), "--config", "llama-3.1-8b-instruct"]) == 0
    config, _ = load_config("llama-3.1-8b-instruct")
    assert json.loads((out / "config.json").read_text()) == config
    tok = json.loads((out / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    assert tok["model"]["type"] == "WordLevel" and tok["pre_tokenizer"] == {"type": "WhitespaceSplit"}
    assert len(vocab) == 128256 and vocab["t0"] == 0 and vocab["t128255"] == 128255
    tcfg = json.loads((out / "tokenizer_config.json").read_text())
    assert tcfg["bos_token"] == "t128000" and tcfg["eos_token"] == "t128001"
    assert json.loads((out / "generation_config.json").read_text()) == {"bos_token_id": 128000, "eos_token_id": 128001}
    assert _make_model().main([str(tmp_path / "x"), "--config", "no-such-model"]) == 2


def test_the_dense_sweep_holds_the_short_grid_and_what_it_must_predict():
    dense = load_sweep(DENSE)
    points = set(dense.points())
    short = set(load_sweep(REPO / "sweeps" / "calibrate-short.yaml").points())
    assert len(points) == 126 and len(short) == 32 and short <= points
    held = points - short
    assert {b for b, _, _ in held} == {2048, 4096, 8192} and {d for _, d, _ in held} >= {0, 3, 8}
    assert dense.grid.chunk_sizes[-1] == 4096  # the held-out chunk size runs last
    assert dense.reps == 3 and dense.mode == "fast" and dense.model == "llama-3.1-8b-instruct"
    command = " ".join(dense.launcher.command.split())  # type: ignore[union-attr]
    assert "/tmp/model/llama-3.1-8b-instruct" in command and "--load-format dummy" in command
    script = (REPO / "scripts" / "gpu" / "dense-h200.sh").read_text()
    assert "MODEL=${MODEL:-llama-3.1-8b-instruct}" in script
    assert "SWEEP=${SWEEP:-sweeps/h200-dense-llama-3.1-8b.yaml}" in script


QWEN_IDS, LLAMA_IDS = (151643, 151645), (128000, 128001)  # (BOS, first EOS) of each family's config.json
# the references every projection since the sixth model learnt from
FOUR_REFS = "h200-qwen3-coder-30b-a3b,h200-llama-3.1-8b-instruct,h200-qwen2.5-32b-instruct,h200-qwen3-14b"
HELD_OUT_MODELS = [  # (model, sweep, chunk size, max-model-len, the references its projection learnt from, vocab,
    # BOS and EOS ids)
    ("qwen2.5-32b-instruct", "h200-dense-qwen2.5-32b.yaml", 3072, 32768,
     "h200-qwen3-coder-30b-a3b,h200-llama-3.1-8b-instruct", 152064, QWEN_IDS),
    ("qwen3-14b", "h200-dense-qwen3-14b.yaml", 6144, 40960,
     "h200-qwen3-coder-30b-a3b,h200-llama-3.1-8b-instruct,h200-qwen2.5-32b-instruct", 151936, QWEN_IDS),
    ("qwen2.5-7b-instruct", "h200-dense-qwen2.5-7b.yaml", 8192, 32768, FOUR_REFS, 152064, QWEN_IDS),
    ("llama-3.2-3b-instruct", "h200-dense-llama-3.2-3b.yaml", 8192, 32768, FOUR_REFS, 128256, LLAMA_IDS),
    ("qwen3-4b", "h200-dense-qwen3-4b.yaml", 8192, 32768, FOUR_REFS, 151936, QWEN_IDS),
    ("llama-3.2-1b-instruct", "h200-dense-llama-3.2-1b.yaml", 8192, 32768, FOUR_REFS, 128256, LLAMA_IDS),
]


@pytest.mark.parametrize(("model", "sweep", "chunk", "max_len", "references", "vocab_size", "ids"), HELD_OUT_MODELS)
def test_a_held_out_model_is_held_out_whole_and_its_projection_committed_before_the_run(
    tmp_path: Path, model: str, sweep: str, chunk: int, max_len: int, references: str, vocab_size: int,
    ids: tuple[int, int],
):
    """Qwen2.5-32B, then Qwen3-14B (issue 36): a model no calibrated profile was fitted on, at a chunk size no
    measured run of its kind used; its learned projection from the references covers every configuration of
    its sweep, and the model folder make_model.py writes for it holds its BOS/EOS ids inside the tokenizer's
    vocabulary."""
    spec = load_sweep(REPO / "sweeps" / sweep)
    assert spec.model == model and spec.grid.chunk_sizes == [chunk] and spec.reps == 3
    command = " ".join(spec.launcher.command.split())  # type: ignore[union-attr]
    assert f"/tmp/model/{model} --served-model-name {model}" in command
    # transformers 5.17 gives model types qwen2 / qwen3 their own tokenizer class from config.json (it encodes
    # nothing of the word-level tokenizer): vLLM loads the tokenizer from the folder without config.json
    assert f"--tokenizer /tmp/model/{model}/tokenizer " in command
    assert f"--max-model-len {max_len}" in command
    run = _dense_report().MODELS[model]
    assert run.max_model_len == max_len and run.fitted_grid() == set()
    doc = json.loads((run.results / "predictions.json").read_text())
    assert doc["calibration"] == "projected"
    assert doc["profile"].endswith(f"(learned rule, from {references})")
    assert {(p["chunk_size"], p["decode_batch_size"], p["new_prefill_tokens"]) for p in doc["points"]} == set(
        spec.points()
    )
    out = tmp_path / "m"
    assert _make_model().main([str(out), "--config", model]) == 0
    vocab = json.loads((out / "tokenizer.json").read_text())["model"]["vocab"]
    generation = json.loads((out / "generation_config.json").read_text())
    assert len(vocab) == vocab_size and vocab["t5"] == 5
    assert (vocab[f"t{generation['bos_token_id']}"], vocab[f"t{generation['eos_token_id']}"]) == ids
    tokenizer_only = sorted(f.name for f in (out / "tokenizer").iterdir())
    assert tokenizer_only == ["tokenizer.json", "tokenizer_config.json"]
    for name in tokenizer_only:
        assert (out / "tokenizer" / name).read_bytes() == (out / name).read_bytes()


def test_the_small_prompt_diagnostic_differs_from_its_twin_only_by_async_scheduling():
    """Session 34's next-H100 plan: the two small-prompt sweeps of Llama-3.2-3B read one question (is the 3-5 ms
    a small prompt costs a CPU cost async scheduling no longer hides?) only if the engine's flags differ by
    `--no-async-scheduling` alone, and their grid is the planned grid's small prompts at its chunk size."""
    on, off = (load_sweep(REPO / "sweeps" / f"h200-dense-llama-3.2-3b-smallp{s}.yaml") for s in ("", "-sync"))
    planned = load_sweep(REPO / "sweeps" / "h200-dense-llama-3.2-3b.yaml")
    flags_on, flags_off, flags_planned = (" ".join(s.launcher.command.split())  # type: ignore[union-attr]
                                          for s in (on, off, planned))
    assert flags_on == flags_planned and "async" not in flags_on
    assert flags_off == flags_on + " --no-async-scheduling"
    assert list(on.points()) == list(off.points()) and on.grid.chunk_sizes == planned.grid.chunk_sizes
    assert {p for _, _, p in on.points()} == {64, 128, 256, 512, 1024} and 0 not in {d for _, d, _ in on.points()}
    assert (on.reps, on.mode) == (off.reps, off.mode) == (planned.reps, planned.mode)


def test_the_projection_is_committed_before_the_run():
    """Both projections (the rule before issue 36, and the learned one from the MoE profile alone) are
    committed with every configuration of the grid; the shipped profile is the projection until the
    run's calibration replaces it."""
    prof = load_profile("h200-llama-3.1-8b-instruct")
    assert prof.calibration in ("projected", "calibrated") and prof.model.architecture == "LlamaForCausalLM"
    for name, rule in (("predictions.json", None), ("predictions-learned.json", "learned rule")):
        doc = json.loads((REPO / "results" / "h200-vllm0.22-llama-3.1-8b-instruct" / name).read_text())
        assert doc["profile"].startswith(prof.name) and doc["calibration"] == "projected"
        assert rule is None or rule in doc["profile"]
        keys = {(p["chunk_size"], p["decode_batch_size"], p["new_prefill_tokens"]) for p in doc["points"]}
        assert keys == set(load_sweep(DENSE).points())
        assert all(p["prefill_duration"] > 0 for p in doc["points"])


def _dense_report():  # type: ignore[no-untyped-def]
    return gpu_script("dense_report")


def test_the_comparison_takes_a_partial_grid_and_names_a_record_cut_short(tmp_path: Path):
    """A run stopped at its deadline: B = 8192 only, part of it, one record cut short mid-write. The
    comparison covers what came back, says how much of each chunk size, and names the broken record."""
    from pdexporter.predict.grid import predict_records

    keys = [(8192, d, p) for d in (0, 4) for p in (2048, 8192)] + [(8192, 12, 32768)]
    # the profile predictions.json was made from: the projection, committed before the run (the shipped
    # profile is now calibrated from that run)
    projected = REPO / "tests" / "fixtures" / "profiles" / "h200-llama-3.1-8b-instruct-projected.yaml"
    predict_records(load_profile(projected), keys, load_sweep(DENSE).protocol, out=tmp_path, mode="fast")
    (tmp_path / "8192" / "D12_P32768.json").write_text('{"config": {"chunk_size": 8192')  # cut short
    predictions = REPO / "results" / "h200-vllm0.22-llama-3.1-8b-instruct" / "predictions.json"
    text = _dense_report().compare(tmp_path, predictions, tmp_path / "out")
    assert "against 4 of the 126 configurations" in text
    assert "B = 8192: 4 of 42, B = 2048: 0 of 42, B = 4096: 0 of 42" in text
    assert "Not compared: (8192, 12, 32768)" in text and "not valid JSON" in text
    # the projection predicted its own records: no error but the window's own spread
    rows = (tmp_path / "out" / "comparison.csv").read_text().splitlines()
    assert len(rows) == 5 and rows[0].startswith("B,D,P,reps,in_short_grid,baseline_tpot measured")
    assert "| prefill_duration | 0.0 % |" in text


def test_the_comparison_scores_apart_the_penalties_the_run_resolves(tmp_path: Path):
    """A penalty under criterion 4's near-zero share of the decode step (64 tokens beside 4 decodes) is left out of
    the "resolved" group with all its quantities; a prefill beside no decodes is always in it."""
    from pdexporter.analysis.cv_causes import NEAR_ZERO
    from pdexporter.predict.calibrate import RESOLVED
    from pdexporter.predict.grid import predict_records

    keys = [(8192, 4, 64), (8192, 4, 4096), (8192, 0, 512)]
    run = _dense_report().MODELS["qwen3-8b"]
    profile = load_profile(run.results / "projected-h100-qwen3-8b.yaml")
    predict_records(profile, keys, run.spec.protocol, out=tmp_path, mode="fast")
    _dense_report().compare(tmp_path, run.results / "predictions.json", tmp_path / "out", model="qwen3-8b")
    rows = {(r["D"], r["P"]): r for r in csv.DictReader((tmp_path / "out" / "comparison.csv").open())}
    small, big = rows[("4", "64")], rows[("4", "4096")]
    assert float(small["penalty measured"]) < NEAR_ZERO * float(small["baseline_tpot measured"])
    assert float(big["penalty measured"]) >= NEAR_ZERO * float(big["baseline_tpot measured"])
    text = (tmp_path / "out" / "comparison.md").read_text()
    section = text.split(f"**{RESOLVED}")[1]
    table = {line.split("|")[1].strip(): line.split("|")[-2].strip() for line in section.splitlines()
             if line.startswith("| ") and not line.startswith("| quantity")}
    assert table["penalty"] == "1" and table["prefill_duration"] == "2" and table["baseline_tpot"] == "1"


def test_the_third_models_comparison_holds_out_the_whole_grid(tmp_path: Path):
    """Nothing was fitted on the Qwen2.5-32B run: the comparison's "all measured" is the held-out set, and
    there is no "held out of the short grid" section."""
    from pdexporter.predict.grid import predict_records

    run = _dense_report().MODELS["qwen2.5-32b-instruct"]
    predictions = run.results / "predictions.json"
    from pdexporter.sim.modelconfig import profile_from_config

    cfg, source = load_config("qwen2.5-32b-instruct")
    profile = profile_from_config(
        cfg,
        "H200",
        name="h200-qwen2.5-32b-instruct",
        model_name="qwen2.5-32b-instruct",
        source=source,
        carry_from=["h200-qwen3-coder-30b-a3b", "h200-llama-3.1-8b-instruct"],
        rule="learned",
        max_model_len=32768,
    )
    # predictions.json was made before the dense references' engine-loop latencies were learnt (issue 36): the
    # engine loop then was the MoE profile's, all of it
    profile = profile.model_copy(update={"engine_loop": load_profile("h200-qwen3-coder-30b-a3b").engine_loop})
    predict_records(profile, [(3072, 4, 2048), (3072, 0, 512)], run.spec.protocol, out=tmp_path, mode="fast")
    text = _dense_report().compare(tmp_path, predictions, tmp_path / "out", model="qwen2.5-32b-instruct")
    assert "against 2 of the 30 configurations" in text and "all held out (nothing fitted on this run)" in text
    assert "short grid" not in text and "| prefill_duration | 0.0 % |" in text


@pytest.mark.parametrize("sweep", ["h200.yaml", "h200-reference.yaml", "h200-validation.yaml", "h200-seed-graphs.yaml"])
def test_another_gpus_copy_of_a_sweep_changes_the_gpu_and_the_context_length_only(tmp_path: Path, sweep: str):
    """scripts/gpu/grid-for-gpu.sh (GPU session 27's H100 grid): `gpu` and `--max-model-len`, nothing else;
    without GPU or MAX_MODEL_LEN the file itself."""

    def run(**env: str) -> str:
        script = f"source scripts/gpu/grid-for-gpu.sh && grid_for_gpu sweeps/{sweep} {tmp_path}"
        return subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True, check=True,
                              env={k: v for k, v in os.environ.items() if k not in ("GPU", "MAX_MODEL_LEN")} | env,
                              timeout=30).stdout.strip()

    assert run() == f"sweeps/{sweep}"
    copy = Path(run(GPU="H100", MAX_MODEL_LEN="65536"))
    original, changed = load_sweep(REPO / "sweeps" / sweep), load_sweep(copy)
    assert (original.gpu, changed.gpu) == ("H200", "H100")
    assert "--max-model-len 200000" in original.launcher.command
    assert changed.launcher.command == original.launcher.command.replace("--max-model-len 200000",
                                                                         "--max-model-len 65536")
    assert changed.grid == original.grid and changed.protocol == original.protocol and changed.reps == original.reps
