"""Write a model folder that vLLM can serve with --load-format dummy, for any config.json.

The make_model.py of the GPU recipe (../shared/gpu/make_model.py) made for one model, Qwen3-Coder-30B-A3B;
this one takes the model's config.json (the shipped ones: pdexporter/sim/configs/*.json, written
from the models' published shapes) and writes:

- config.json, as given (vLLM builds the architecture from it; the weights are random, drawn by
  vLLM, so timings match the real model's shapes and outputs are meaningless);
- generation_config.json with the config's BOS/EOS ids;
- a word-level tokenizer with one token per id ("t0" .. "t<vocab-1>", split on whitespace), so any
  id the model emits can be decoded; prompts are sent as token ids. tokenizer.json is written as
  the JSON the `tokenizers` library saves for such a tokenizer (no download, no dependency);
- the same tokenizer files again in OUT_DIR/tokenizer/, a folder without config.json, for
  `vllm serve --tokenizer`: transformers 5.17 (vLLM 0.22's) picks a model type's own tokenizer
  class from config.json whatever tokenizer_config.json says, and for `qwen2` that is
  Qwen2Tokenizer, which encodes "t7 t9" to [] (GPU session 12, 2026-12-04); from a folder
  without config.json, AutoTokenizer takes the tokenizer_class given (TokenizersBackend: [7, 9]).

usage: python3 scripts/gpu/make_model.py OUT_DIR --config pdexporter/sim/configs/llama-3.1-8b-instruct.json
       python3 scripts/gpu/make_model.py OUT_DIR --config llama-3.1-8b-instruct   # a shipped one by name
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

CONFIGS = Path(__file__).resolve().parents[2] / "pdexporter" / "sim" / "configs"


def _first(value: object, default: int) -> int:
    if isinstance(value, list) and value:
        return int(value[0])
    return int(value) if isinstance(value, int) else default


def tokenizer_json(vocab: int) -> dict[str, object]:
    """A WordLevel tokenizer over "t0".."t<vocab-1>", whitespace-split, unknown words -> t0."""
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "vocab": {f"t{i}": i for i in range(vocab)}, "unk_token": "t0"},
    }


def write_model(out: Path, config: dict[str, object]) -> Path:
    vocab = int(config["vocab_size"])  # type: ignore[call-overload]
    bos = _first(config.get("bos_token_id"), 0)
    eos = _first(config.get("eos_token_id"), bos)
    max_len = int(config.get("max_position_embeddings") or 131072)  # type: ignore[call-overload]
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=1))
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": bos, "eos_token_id": eos}))
    tokenizer = json.dumps(tokenizer_json(vocab))
    tokenizer_config = json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_len,
        "bos_token": f"t{bos}", "eos_token": f"t{eos}", "unk_token": "t0", "pad_token": f"t{eos}",
        "chat_template": "{% for m in messages %}{{ m['content'] }} {% endfor %}",
    })
    for folder in (out, out / "tokenizer"):
        folder.mkdir(exist_ok=True)
        (folder / "tokenizer.json").write_text(tokenizer)
        (folder / "tokenizer_config.json").write_text(tokenizer_config)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--config", required=True, help="a config.json, or the name of a shipped one")
    args = ap.parse_args(argv)
    path = Path(args.config)
    if not path.exists():
        path = CONFIGS / f"{args.config}.json"
    if not path.is_file():
        print(f"make_model: {args.config}: no such config.json (shipped: "
              f"{', '.join(p.stem for p in sorted(CONFIGS.glob('*.json')))})", file=sys.stderr)
        return 2
    config = json.loads(path.read_text())
    write_model(args.out, config)
    print(f"model folder written: {args.out} ({config.get('architectures')}, vocab {config['vocab_size']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
