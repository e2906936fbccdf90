"""Rewrites a GGUF with every quantized tensor dequantized and stored as BF16, or F16 with a
third argument `f16` (metadata kept): `to_bf16.py SRC DST [f16]`."""
import sys, numpy as np, gguf
from gguf.quants import dequantize
src, dst = sys.argv[1], sys.argv[2]
f16 = len(sys.argv) > 3 and sys.argv[3] == "f16"
r = gguf.GGUFReader(src)
arch = r.fields['general.architecture'].contents()
w = gguf.GGUFWriter(dst, arch)
for name, f in r.fields.items():
    if name.startswith('GGUF.') or name == 'general.architecture':
        continue
    t = f.types[0]
    if t == gguf.GGUFValueType.ARRAY:
        w.add_key_value(name, f.contents(), t, sub_type=f.types[-1])
    else:
        w.add_key_value(name, f.contents(), t)
for t in r.tensors:
    shape = [int(x) for x in reversed(t.shape)]
    if t.tensor_type in (gguf.GGMLQuantizationType.F32,):
        w.add_tensor(t.name, np.asarray(t.data).reshape(shape), raw_dtype=gguf.GGMLQuantizationType.F32)
        continue
    x = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape)
    if x.ndim == 1:
        w.add_tensor(t.name, x, raw_dtype=gguf.GGMLQuantizationType.F32)
        continue
    if f16:
        w.add_tensor(t.name, x.astype(np.float16), raw_dtype=gguf.GGMLQuantizationType.F16)
        continue
    b = x.view(np.uint32)
    b = ((b + 0x7fff + ((b >> 16) & 1)) >> 16).astype(np.uint16)
    w.add_tensor(t.name, b, raw_shape=shape, raw_dtype=gguf.GGMLQuantizationType.BF16)
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
