"""Register use of one CUDA module text for sm_90, without a GPU: NVRTC to PTX, then ptxas -v.

usage: ptxas_report.py LIBNVRTC PTXAS FILE.cu
Prints one line per kernel: the file's name, the kernel's, then its registers, stack frame,
spill stores and spill loads (bytes). Exits non-zero, naming the file, if either step fails.
"""
import ctypes
import os
import re
import subprocess
import sys
import tempfile


def ptx(libnvrtc, path):
    lib = ctypes.CDLL(libnvrtc)
    prog = ctypes.c_void_p()
    text = open(path, "rb").read()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), text, path.encode(), 0, None, None):
        sys.exit(f"{path}: nvrtcCreateProgram failed")
    opts = [b"--gpu-architecture=compute_90", b"--std=c++17", b"--use_fast_math"]
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    n = ctypes.c_size_t()
    if rc:
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
        log = ctypes.create_string_buffer(n.value)
        lib.nvrtcGetProgramLog(prog, log)
        sys.exit(f"{path}: NVRTC failed:\n{log.value.decode()}")
    lib.nvrtcGetPTXSize(prog, ctypes.byref(n))
    out = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetPTX(prog, out)
    return out.value


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    libnvrtc, ptxas, path = sys.argv[1:4]
    module = os.path.basename(path).removesuffix(".cu")
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "m.ptx")
        with open(src, "wb") as f:
            f.write(ptx(libnvrtc, path))
        run = subprocess.run([ptxas, "-arch=sm_90", "-v", src, "-o", os.path.join(tmp, "m.cubin")],
                             capture_output=True, text=True)
    if run.returncode:
        sys.exit(f"{path}: ptxas failed:\n{run.stderr}")
    name = frame = stores = loads = None
    for line in run.stderr.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            name = m.group(1)
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            frame, stores, loads = m.groups()
        m = re.search(r"Used (\d+) registers", line)
        if m and name and frame is not None:
            print(f"{module} {name} registers {m.group(1)} stack {frame} spill_stores {stores} spill_loads {loads}")
            name = frame = None


main()
