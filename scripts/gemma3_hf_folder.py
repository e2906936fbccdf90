#!/usr/bin/env python3
"""A Hugging Face folder of Gemma 3 270M's GGUF weights, for the loader's test of such folders
(crates/model/tests/reference_logits.rs, gemma3_from_a_hugging_face_folder_matches_transformers).

The weights are the GGUF's, dequantized and stored in bf16; the norms go back to Gemma's form
(the GGUF stores `1 + w` of `x * (1 + w)`). config.json, tokenizer.json and
tokenizer_config.json are what transformers makes of the GGUF. Environment as in
scripts/reference_logits.py; the GGUF is read from /tmp/gemma/gemma3.gguf and the folder
written to /tmp/models/gemma3-270m-hf.
"""
import json, os, numpy as np, torch, gguf
from gguf.quants import dequantize
from safetensors.torch import save_file
from transformers import AutoConfig, AutoTokenizer
out = '/tmp/models/gemma3-270m-hf'
os.makedirs(out, exist_ok=True)
r = gguf.GGUFReader('/tmp/gemma/gemma3.gguf')
names = {'attn_norm': 'input_layernorm', 'attn_q': 'self_attn.q_proj', 'attn_k': 'self_attn.k_proj',
         'attn_v': 'self_attn.v_proj', 'attn_output': 'self_attn.o_proj', 'attn_q_norm': 'self_attn.q_norm',
         'attn_k_norm': 'self_attn.k_norm', 'post_attention_norm': 'post_attention_layernorm',
         'ffn_norm': 'pre_feedforward_layernorm', 'post_ffw_norm': 'post_feedforward_layernorm',
         'ffn_gate': 'mlp.gate_proj', 'ffn_up': 'mlp.up_proj', 'ffn_down': 'mlp.down_proj'}
tensors = {}
for t in r.tensors:
    w = dequantize(t.data, t.tensor_type).astype(np.float32)
    parts = t.name.split('.')
    if parts[0] == 'blk':
        hf = f'model.layers.{parts[1]}.{names[parts[2]]}.weight'
    elif t.name == 'token_embd.weight':
        hf = 'model.embed_tokens.weight'
    elif t.name == 'output_norm.weight':
        hf = 'model.norm.weight'
    else:
        raise SystemExit(t.name)
    if 'norm' in hf:
        w = w - 1.0
    tensors[hf] = torch.from_numpy(np.ascontiguousarray(w)).to(torch.bfloat16)
save_file(tensors, f'{out}/model.safetensors', metadata={'format': 'pt'})
cfg = AutoConfig.from_pretrained('/tmp/gemma', gguf_file='gemma3.gguf')
cfg.save_pretrained(out)
tok = AutoTokenizer.from_pretrained('/tmp/gemma', gguf_file='gemma3.gguf')
tok.save_pretrained(out)
print('ok', len(tensors))
