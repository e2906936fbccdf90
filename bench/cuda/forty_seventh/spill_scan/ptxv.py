# usage: ptxv.py file.cu  -> prints ptxas -v for sm_90
import ctypes, sys, subprocess
lib = ctypes.CDLL('/tmp/nv/nvidia/cuda_nvrtc/lib/libnvrtc.so.12')
src = open(sys.argv[1]).read().encode()
prog = ctypes.c_void_p()
assert lib.nvrtcCreateProgram(ctypes.byref(prog), src, b"k.cu", 0, None, None) == 0
opts = [b"--gpu-architecture=compute_90", b"--std=c++17", b"--use_fast_math"]
arr = (ctypes.c_char_p * len(opts))(*opts)
rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
n = ctypes.c_size_t(); lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
log = ctypes.create_string_buffer(n.value); lib.nvrtcGetProgramLog(prog, log)
if rc != 0:
    print(log.value.decode()); sys.exit(1)
lib.nvrtcGetPTXSize(prog, ctypes.byref(n)); ptx = ctypes.create_string_buffer(n.value); lib.nvrtcGetPTX(prog, ptx)
open('/tmp/k.ptx','wb').write(ptx.value)
r = subprocess.run(['/tmp/nv/nvidia/cuda_nvcc/bin/ptxas','-arch=sm_90','-v','/tmp/k.ptx','-o','/tmp/k.cubin'],capture_output=True,text=True)
print(r.stderr[-3000:])
