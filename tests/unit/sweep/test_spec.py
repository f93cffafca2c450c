"""The sweep file format: shipped files load, wrong fields are one-line errors naming them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pdexporter.errors import ConfigError
from pdexporter.launch.local import render_command
from pdexporter.launch.specs import ExternalLauncherSpec, LocalLauncherSpec, SimLauncherSpec
from pdexporter.sweep.spec import load_sweep, parse_sweep

ROOT = Path(__file__).resolve().parents[3]
SEED_D = [0, 1, 2, 4, 6, 8, 12]
SEED_P = [512, 1024, 2048, 4096, 8192, 16384, 32768]
GRID = {"chunk_sizes": [8192], "decode_batch_sizes": [0, 4], "new_prefill_tokens": [512]}


def error_of(data: dict, source: str = "sweeps/x.yaml") -> str:
    with pytest.raises(ConfigError) as info:
        parse_sweep(data, source)
    text = str(info.value)
    assert "\n" not in text
    return text


def test_seed_file_is_the_seeds_full_grid() -> None:
    spec = load_sweep(ROOT / "sweeps" / "seed.yaml")
    assert sorted(spec.grid.chunk_sizes) == [2048, 4096, 8192, 16384]
    assert spec.grid.decode_batch_sizes == SEED_D and spec.grid.new_prefill_tokens == SEED_P
    assert spec.grid.size == 196 and len(list(spec.points())) == 196
    assert spec.reps == 5 and spec.mode == "faithful" and spec.cooldown_s == 5.0
    assert spec.protocol.decode_context_tokens == 4096 and spec.protocol.decode_output_tokens == 256
    assert spec.cv.threshold == 0.15


def test_reduced_is_chunk_8192_only() -> None:
    spec = load_sweep(ROOT / "sweeps" / "reduced.yaml")
    assert spec.grid.chunk_sizes == [8192] and spec.grid.size == 49


def test_h200_file_runs_the_gpu_readme_command_fast() -> None:
    spec = load_sweep(ROOT / "sweeps" / "h200.yaml")
    assert spec.mode == "fast" and spec.reps == 5 and spec.gpu == "H200" and spec.cooldown_s == 0
    assert spec.grid.chunk_sizes == [8192, 2048, 4096, 16384]
    launcher = spec.launcher
    assert isinstance(launcher, LocalLauncherSpec)
    assert 300 <= launcher.health_timeout_s <= 600
    for needle in ("PYTHONPATH=/tmp/site", "VLLM_USE_FLASHINFER_SAMPLER=0", "vllm.entrypoints.cli.main serve",
                   "--max-num-batched-tokens {chunk}", "--enable-logging-iteration-details", "--load-format dummy",
                   "--enable-prefix-caching", "--enable-chunked-prefill", "--max-model-len 200000"):
        assert needle in launcher.command


@pytest.mark.parametrize("name", ["h200-modes", "h200-launch", "h200-graphs", "h200-graphs-2048", "h200-eager"])
def test_gpu_experiment_files_share_the_h200_engine_command(name: str) -> None:
    """The second GPU session's files: the same vLLM as h200.yaml (so one engine serves every run of
    a session), plus a CUDA-graph capture list no larger than the chunk where vLLM requires it."""
    base = load_sweep(ROOT / "sweeps" / "h200.yaml").launcher
    spec = load_sweep(ROOT / "sweeps" / f"{name}.yaml")
    assert isinstance(base, LocalLauncherSpec) and isinstance(spec.launcher, LocalLauncherSpec)
    (chunk,) = spec.grid.chunk_sizes
    argv = render_command(spec.launcher.command, chunk, spec.launcher.vars).argv
    base_argv = render_command(base.command, chunk, {**base.vars, **base.lane_values(0)}).argv  # its first port
    assert argv[: len(base_argv)] == base_argv
    if "graphs" in name:
        flag, value = argv[len(base_argv):]
        config = json.loads(value)
        assert flag == "--compilation-config"
        assert max(config["cudagraph_capture_sizes"]) == config["max_cudagraph_capture_size"] <= chunk
    elif "eager" in name:
        assert argv[len(base_argv):] == ("--enforce-eager",)
    else:
        assert argv == base_argv


def test_the_seed_grid_with_graphs_differs_from_the_seed_grid_by_its_capture_sizes_alone() -> None:
    """sweeps/h200-seed-graphs.yaml (issue 32's criterion 4 at its source): h200.yaml's grid, protocol and engine
    command, plus capture sizes that put every one-chunk step of P <= 2048 beside <= 12 decodes, and B = 2048's
    full chunk steps, on a CUDA graph; the adapter reads 2048 at B = 2048 (vLLM drops larger sizes) and 2064 above."""
    from pdexporter.engines.vllm import graph_max_tokens_of

    base, graphs = load_sweep(ROOT / "sweeps" / "h200.yaml"), load_sweep(ROOT / "sweeps" / "h200-seed-graphs.yaml")
    assert isinstance(base.launcher, LocalLauncherSpec) and isinstance(graphs.launcher, LocalLauncherSpec)
    assert (graphs.grid, graphs.protocol, graphs.reps, graphs.mode, graphs.cv) == (
        base.grid, base.protocol, base.reps, base.mode, base.cv)
    for chunk in graphs.grid.chunk_sizes:
        lane = {**base.launcher.vars, **base.launcher.lane_values(0)}
        base_argv = render_command(base.launcher.command, chunk, lane).argv
        argv = render_command(graphs.launcher.command, chunk, {**graphs.launcher.vars, **lane}).argv
        assert argv[: len(base_argv)] == base_argv and argv[len(base_argv)] == "--compilation-config"
        assert graph_max_tokens_of(base_argv, chunk) == 512
        largest = graph_max_tokens_of(argv, chunk)
        assert largest == (2048 if chunk == 2048 else 2064)
        one_chunk = [p + d for p in graphs.grid.new_prefill_tokens for d in graphs.grid.decode_batch_sizes
                     if 512 <= p <= 2048 and p + d <= chunk]
        assert one_chunk and all(tokens <= largest for tokens in one_chunk)


def test_an_external_engines_command_gives_its_chunk_size_and_is_recorded_redacted() -> None:
    """`launcher.command` of an external engine: its chunk flag stands for `chunk_size` (vLLM's or SGLang's, by
    `engine` where named), the words recorded have no secret; a contradiction, an unsplittable or empty command,
    a chunk flag that is not a number: one line naming launcher.command."""
    external = {"kind": "external", "url": "http://127.0.0.1:8000"}
    spec = parse_sweep({"grid": GRID, "launcher": {**external, "command": "vllm serve m --api-key=k3y "
                                                   "--max-num-batched-tokens 8192"}}, "sweeps/x.yaml")
    assert isinstance(spec.launcher, ExternalLauncherSpec) and spec.launcher.chunk_size == 8192
    assert spec.launcher.command_words == ("vllm", "serve", "m", "--api-key=***", "--max-num-batched-tokens", "8192")
    sglang = {**external, "engine": "sglang", "command": "python -m sglang.launch_server --chunked-prefill-size 8192"}
    assert parse_sweep({"grid": GRID, "launcher": sglang}, "sweeps/x.yaml").launcher.chunk_size == 8192
    # a vLLM flag on an engine said to be SGLang is not its chunk size: the grid's one chunk size stands
    vllm_flag = {**sglang, "command": "sglang serve --max-num-batched-tokens 4096"}
    assert parse_sweep({"grid": GRID, "launcher": vllm_flag}, "sweeps/x.yaml").launcher.chunk_size == 8192
    for command, fragment in [
        ("vllm serve m --max-num-batched-tokens 4096",
         "launcher.command: it starts the engine with --max-num-batched-tokens 4096, but the chunk size given is 8192"),
        ("vllm serve 'm", "launcher.command: cannot split it into words"),
        ("  ", "launcher.command: empty"),
        ("vllm serve m --max-num-batched-tokens=lots", "launcher.command: --max-num-batched-tokens 'lots' is not a "
                                                       "chunk size"),
    ]:
        assert fragment in error_of({"grid": GRID, "launcher": {**external, "chunk_size": 8192, "command": command}})


def test_quick_runs_on_the_embedded_engine() -> None:
    spec = load_sweep(ROOT / "sweeps" / "quick.yaml")
    assert isinstance(spec.launcher, SimLauncherSpec) and spec.launcher.clock == "virtual"
    assert spec.grid.size <= 16


def test_the_briefs_example_error() -> None:
    data = {"grid": {**GRID, "decode_batch_sizes": [0, 4, -1]}}
    assert error_of(data) == "sweeps/x.yaml: grid.decode_batch_sizes[2]: must be >= 0 (got -1)"


@pytest.mark.parametrize(
    ("patch", "expected"),
    [
        ({"modee": "fast"}, "sweeps/x.yaml: modee: unknown field (did you mean mode?)"),
        ({"zzz": "fast"}, "sweeps/x.yaml: zzz: unknown field (expected one of: name,"),
        (
            {"grid": {"chunk_sizes": [8192], "decode_batch_size": [4], "new_prefill_tokens": [512]}},
            "sweeps/x.yaml: grid.decode_batch_size: unknown field (did you mean decode_batch_sizes?)",
        ),
        ({"mode": "quick"}, "sweeps/x.yaml: mode: must be one of 'faithful' or 'fast' (got 'quick')"),
        ({"reps": 0}, "sweeps/x.yaml: reps: must be >= 1 (got 0)"),
        ({"launcher": {"kind": "docker"}}, "sweeps/x.yaml: launcher.kind: must be one of"),
        (
            {"launcher": {"kind": "local", "command": "vllm serve"}},
            "sweeps/x.yaml: launcher.command: must contain {chunk}",
        ),
        (
            {"launcher": {"kind": "local", "command": "x {chunk}", "health_timeout": 1}},
            "sweeps/x.yaml: launcher.health_timeout: unknown field (did you mean health_timeout_s?)",
        ),
        (
            {"launcher": {"kind": "external", "url": "http://e:8000"}, "grid": {**GRID, "chunk_sizes": [8192, 2048]}},
            "sweeps/x.yaml: launcher.chunk_size: required",
        ),
        (
            {"launcher": {"kind": "external", "url": "http://e:8000", "chunk_size": 2048}},
            "sweeps/x.yaml: grid.chunk_sizes: [8192] cannot be set on the external engine",
        ),
        (
            {"launcher": {"kind": "kubernetes", "url": "http://e:8000", "tool": "kubectl"}},
            "sweeps/x.yaml: launcher: tool kubectl needs deployment",
        ),
        ({"protocol": {"decode_output_tokens": 40}}, "sweeps/x.yaml: protocol: decode_output_tokens=40 leaves no room"),
        ({"cv": {"threshold": 0}}, "sweeps/x.yaml: cv.threshold: must be > 0"),
        ({"listen": "host:port"}, "sweeps/x.yaml: listen:"),
        ({"grid": {**GRID, "chunk_sizes": [8192, 8192]}}, "sweeps/x.yaml: grid.chunk_sizes[1] = 8192 appears twice"),
        ({"grid": {**GRID, "chunk_sizes": [4]}}, "sweeps/x.yaml: grid: D=4 with chunk size 4"),
        ({"grid": {**GRID, "new_prefill_tokens": "many"}}, "sweeps/x.yaml: grid.new_prefill_tokens: must be a list"),
    ],
)
def test_errors_name_the_field(patch: dict, expected: str) -> None:
    assert error_of({"grid": GRID, **patch}).startswith(expected)


def test_missing_grid() -> None:
    assert error_of({}) == "sweeps/x.yaml: grid: required field is missing"


def test_external_engine_with_its_chunk_size_is_accepted() -> None:
    spec = parse_sweep({"grid": GRID, "launcher": {"kind": "external", "url": "http://e:8000/", "chunk_size": 8192}})
    assert isinstance(spec.launcher, ExternalLauncherSpec) and spec.launcher.url == "http://e:8000"


def test_cooldown_defaults_follow_the_mode() -> None:
    assert parse_sweep({"grid": GRID, "mode": "faithful"}).cooldown_s == 5.0
    assert parse_sweep({"grid": GRID, "mode": "fast"}).cooldown_s == 0.0
    assert parse_sweep({"grid": GRID, "mode": "faithful", "cooldown": {"seconds": 2}}).cooldown_s == 2.0
    # Fast mode never idles (its probes would run out while waiting).
    assert parse_sweep({"grid": GRID, "mode": "fast", "cooldown": {"seconds": 2}}).cooldown_s == 0.0


def test_yaml_errors_and_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("grid:\n  chunk_sizes: [1, 2\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: line \d+: not valid YAML"):
        load_sweep(bad)
    listed = tmp_path / "list.yaml"
    listed.write_text("- 1\n")
    with pytest.raises(ConfigError, match="list.yaml: expected a mapping"):
        load_sweep(listed)
    with pytest.raises(ConfigError, match="nope.yaml: cannot read"):
        load_sweep(tmp_path / "nope.yaml")


def test_overrides_are_validated_like_the_file(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("grid:\n  chunk_sizes: [2048]\n  decode_batch_sizes: [1]\n  new_prefill_tokens: [512]\n")
    assert load_sweep(path, {"mode": "fast", "reps": 2}).mode == "fast"
    with pytest.raises(ConfigError, match="s.yaml: mode: must be one of"):
        load_sweep(path, {"mode": "turbo"})
    # set by a flag: the flag is to blame, not the file
    with pytest.raises(ConfigError, match=r"^--mode 'turbo': must be one of 'faithful' or 'fast'$"):
        load_sweep(path, {"mode": "turbo"}, flags={"mode": "--mode"})
    with pytest.raises(ConfigError, match=r"^--clock 'wall': must be one of"):
        load_sweep(path, {"launcher.clock": "wall"}, flags={"launcher.clock": "--clock", "mode": "--mode"})
    assert load_sweep(path, {"launcher.clock": "real"}).launcher.clock == "real"  # the file's default launcher
    local = tmp_path / "local.yaml"
    local.write_text(path.read_text() + "launcher:\n  kind: local\n  command: serve {chunk}\n")
    with pytest.raises(ConfigError, match=r"^--clock 'real': the file's launcher has no clock$"):
        load_sweep(local, {"launcher.clock": "real"}, flags={"launcher.clock": "--clock"})
    # a flag that set something else does not take the blame for the file's own mistake
    path.write_text("grid:\n  chunk_sizes: [2048]\n  decode_batch_sizes: [1]\n  new_prefill_tokens: [512]\n"
                    "reps: 0\n")
    with pytest.raises(ConfigError, match=r"s.yaml: reps: must be >= 1 \(got 0\)$"):
        load_sweep(path, {"mode": "fast"}, flags={"mode": "--mode"})


def test_an_engine_already_running_runs_the_grid_at_its_chunk_size(tmp_path: Path) -> None:
    from pdexporter.sweep.spec import external_engine

    grid = {"chunk_sizes": [2048, 8192], "decode_batch_sizes": [0, 4], "new_prefill_tokens": [512],
            "only": [[2048, 4, 512], [8192, 0, 512]]}
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump({"grid": grid}))
    spec = load_sweep(path, external=("http://e:8000", 8192))
    assert spec.grid.chunk_sizes == [8192] and spec.grid.only == [(8192, 0, 512)]
    assert (spec.launcher.kind, spec.launcher.url, spec.launcher.chunk_size) == ("external", "http://e:8000", 8192)
    with pytest.raises(ConfigError, match=r"^--target http://e:8000: .*two.yaml has chunk sizes 2048, 8192 .*pass "
                                          r"--chunk-size B"):
        load_sweep(path, external=("http://e:8000", None))
    with pytest.raises(ConfigError, match=r"^--chunk-size 4096: not in .*two.yaml's grid.chunk_sizes \(2048, 8192\)$"):
        load_sweep(path, external=("http://e:8000", 4096))
    # one chunk size in the grid: it is the engine's, --chunk-size or not
    assert external_engine({"chunk_sizes": [2048]}, "http://e:8000", None, "f") == {
        "launcher": {"kind": "external", "url": "http://e:8000", "chunk_size": None}}
    assert load_sweep(path, chunk_index=0, external=("http://e:8000", None)).launcher.chunk_size == 2048


def test_sweep_target_takes_its_chunk_size_from_the_engine_command(tmp_path: Path) -> None:
    """`sweep FILE --target URL --engine-command '...'`: the command's chunk flag picks the grid's chunk size, the
    launcher records the command (redacted); a size the grid lacks is blamed on the command, not on -B."""
    from pdexporter.sweep.job import sweep_spec

    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump({"grid": {"chunk_sizes": [2048, 8192], "decode_batch_sizes": [4],
                                             "new_prefill_tokens": [512]}}))
    spec = sweep_spec(path, target="http://e:8000", engine_command="vllm serve m --max-num-batched-tokens 2048 "
                                                                  "--api-key k")
    assert spec.grid.chunk_sizes == [2048] and isinstance(spec.launcher, ExternalLauncherSpec)
    assert spec.launcher.command_words == ("vllm", "serve", "m", "--max-num-batched-tokens", "2048", "--api-key", "***")
    with pytest.raises(ConfigError, match=r"^--engine-command's --max-num-batched-tokens 4096: not in .*two.yaml"):
        sweep_spec(path, target="http://e:8000", engine_command="vllm serve m --max-num-batched-tokens 4096")
    with pytest.raises(ConfigError, match=r"^--engine-command: only with --target"):
        sweep_spec(path, engine_command="vllm serve m")


def test_fast_probes_have_room_for_the_largest_window() -> None:
    spec = parse_sweep({"grid": {"chunk_sizes": [2048], "decode_batch_sizes": [12], "new_prefill_tokens": [32768]},
                        "mode": "fast", "fast": {"max_context_drift_tokens": 8}})
    # 17 chunks of 2036 tokens + recovery: a probe must carry at least one whole window.
    assert spec.fast_probe_tokens(2048) >= 32 + 17 + 32


def test_an_external_engine_runs_the_single_chunk_size_of_its_grid(tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump({"grid": GRID, "launcher": {"kind": "external", "url": "http://e:8000"}}))
    assert load_sweep(path).launcher.chunk_size == 8192


def test_h200x2_file_runs_h200s_engine_on_two_gpus_interleaved() -> None:
    from pdexporter.launch.specs import MULTI_GPU_ENV

    spec = load_sweep(ROOT / "sweeps" / "h200x2.yaml")
    one = load_sweep(ROOT / "sweeps" / "h200.yaml")
    assert spec.grid == one.grid and spec.reps == 5 and spec.mode == "fast" and spec.slots == 2
    assert spec.order.kind == "interleaved"
    launcher, base = spec.launcher, one.launcher
    assert isinstance(launcher, LocalLauncherSpec) and isinstance(base, LocalLauncherSpec)
    assert launcher.gpus == ["0", "1"] and [launcher.slot_url(i) for i in (0, 1)] == [
        "http://127.0.0.1:8000", "http://127.0.0.1:8001"]
    for i in (0, 1):
        argv = render_command(launcher.command, 8192, launcher.slot_values(i), launcher.slot_env(i))
        assert argv.env == {"CUDA_VISIBLE_DEVICES": str(i), **MULTI_GPU_ENV, "PYTHONPATH": "/tmp/site",
                            "VLLM_USE_FLASHINFER_SAMPLER": "0"}
        # h200.yaml's vLLM command, but on port 8000 + i
        assert argv.argv == render_command(base.command, 8192, base.lane_values(i)).argv


@pytest.mark.parametrize("launcher, message", [
    ({"command": "x {chunk}", "gpus": [0, 1]},
     "launcher.command: must contain {port} with launcher.gpus (each GPU's engine has its own port)"),
    ({"command": "x {chunk} --port {port}", "gpus": [0, 1]},
     "launcher.url: must contain {port} with launcher.gpus, e.g. http://127.0.0.1:{port}"),
    ({"command": "x {chunk} --port {port}", "gpus": [0, 0], "url": "http://h:{port}"},
     "launcher.gpus[1] = 0 appears twice"),
    ({"command": "x {chunk} --port {port}", "gpus": [0, 1], "url": "http://h:{port}", "vars": {"port": "1"}},
     "launcher.vars.port: reserved with launcher.gpus (filled in per GPU)"),
])
def test_bad_gpu_settings_are_one_line(launcher: dict, message: str) -> None:
    assert error_of({"grid": GRID, "launcher": {"kind": "local", **launcher}}) == f"sweeps/x.yaml: {message}"


@pytest.mark.parametrize("launcher, message", [
    ({"command": "x {chunk}"},
     "launcher.command: must contain {port} with launcher.overlap_starts (the two engines that take turns listen "
     "on base_port and base_port + 1)"),
    ({"command": "x {chunk} --port {port}"},
     "launcher.url: must contain {port} with launcher.overlap_starts (the two engines that take turns listen on "
     "base_port and base_port + 1)"),
    ({"command": "x {chunk} --port {port}", "url": "http://h:{port}", "gpus": [0, 1]},
     "launcher.overlap_starts: one GPU only (with launcher.gpus each GPU has its own engine)"),
    ({"command": "x {chunk} --port {port}", "url": "http://h:{port}", "base_port": 65535},
     "launcher.base_port: 65535 + 1 runs past port 65535"),
])
def test_bad_overlap_settings_are_one_line(launcher: dict, message: str) -> None:
    assert error_of({"grid": GRID, "launcher": {"kind": "local", "overlap_starts": True, **launcher}}) == (
        f"sweeps/x.yaml: {message}")


def test_overlapped_starts_make_one_provider_with_two_lanes(tmp_path: Path) -> None:
    from pdexporter.launch.overlap import OverlappingLauncher
    from pdexporter.measure.store import ResultsStore
    from pdexporter.sweep.providers import make_providers

    spec = load_sweep(ROOT / "sweeps" / "h200.yaml")
    providers = make_providers(spec, ResultsStore(tmp_path))
    assert len(providers) == 1
    launcher = providers[0].launcher
    assert isinstance(launcher, OverlappingLauncher)
    assert [lane.url for lane in launcher.lanes] == ["http://127.0.0.1:8000", "http://127.0.0.1:8001"]
    argv = [render_command(lane.command, 2048, lane.variables, lane.env).argv for lane in launcher.lanes]
    assert argv[0][argv[0].index("--port") + 1] == "8000" and argv[1][argv[1].index("--port") + 1] == "8001"
    assert providers[0].read_timeout_s == spec.read_timeout_s  # type: ignore[attr-defined]
    assert all(lane.gated and lane.siblings == {other.url} for lane, other in zip(launcher.lanes,
                                                                                   launcher.lanes[::-1], strict=True))


def test_gpus_fill_port_gpu_and_the_environment() -> None:
    spec = parse_sweep({"grid": GRID, "launcher": {
        "kind": "local", "gpus": [2, "GPU-5f1e"], "base_port": 9100, "env": {"NCCL_NVLS_ENABLE": "1"},
        "command": "serve --chunk {chunk} --port {port} --tag g{gpu}", "url": "http://127.0.0.1:{port}/"}})
    launcher = spec.launcher
    assert isinstance(launcher, LocalLauncherSpec) and spec.slots == 2
    assert launcher.slot_values(1) == {"gpu": "GPU-5f1e", "port": "9101"}
    assert launcher.slot_url(0) == "http://127.0.0.1:9100"
    env = launcher.slot_env(1)
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-5f1e" and env["NCCL_NVLS_ENABLE"] == "1"  # env overrides
    assert env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1" and env["NVSHMEM_DISABLE_NVLS"] == "1"
    rendered = render_command(launcher.command, 4096, launcher.slot_values(0), launcher.slot_env(0))
    assert rendered.argv == ("serve", "--chunk", "4096", "--port", "9100", "--tag", "g2")
    assert error_of({"grid": GRID, "order": {"kind": "random"}}) == (
        "sweeps/x.yaml: order.kind: must be one of 'blocked' or 'interleaved' (got 'random')")


def test_chunk_index_keeps_one_chunk_size(tmp_path: Path) -> None:
    spec = load_sweep(ROOT / "sweeps" / "seed.yaml", chunk_index=1)
    assert spec.grid.chunk_sizes == [2048] and spec.grid.size == 49
    with pytest.raises(ConfigError, match=r"^--chunk-index 4: out of range, .*seed.yaml lists 4 chunk size\(s\) "
                                          r"\(indices 0\.\.3\)$"):
        load_sweep(ROOT / "sweeps" / "seed.yaml", chunk_index=4)


def test_grid_only_restricts_the_product_and_must_lie_in_it() -> None:
    from pdexporter.errors import ConfigError
    from pdexporter.sweep.spec import parse_sweep

    spec = parse_sweep({"grid": {"chunk_sizes": [2048, 8192], "decode_batch_sizes": [1, 4],
                                 "new_prefill_tokens": [512, 8192], "only": [[8192, 4, 512], [2048, 1, 8192]]}})
    assert list(spec.points()) == [(2048, 1, 8192), (8192, 4, 512)] and spec.grid.size == 2
    with pytest.raises(ConfigError, match=r"grid.only\[0\] = \[4096, 4, 512\] is not in the grid's lists"):
        parse_sweep({"grid": {"chunk_sizes": [2048], "decode_batch_sizes": [4], "new_prefill_tokens": [512],
                              "only": [[4096, 4, 512]]}})
