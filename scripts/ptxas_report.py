"""Register use of one CUDA module text for sm_90, without a GPU: NVRTC to PTX, then ptxas -v.

usage: ptxas_report.py LIBNVRTC PTXAS FILE.cu
Prints one line per kernel: name, registers, stack frame, spill stores and loads (bytes).
"""
import ctypes
import re
import subprocess
import sys
import tempfile


def ptx(libnvrtc, text):
    lib = ctypes.CDLL(libnvrtc)
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), text, b"module.cu", 0, None, None):
        sys.exit("nvrtcCreateProgram failed")
    opts = [b"--gpu-architecture=compute_90", b"--std=c++17", b"--use_fast_math"]
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    n = ctypes.c_size_t()
    if rc:
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
        log = ctypes.create_string_buffer(n.value)
        lib.nvrtcGetProgramLog(prog, log)
        sys.exit(log.value.decode())
    lib.nvrtcGetPTXSize(prog, ctypes.byref(n))
    out = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetPTX(prog, out)
    return out.value


def main():
    libnvrtc, ptxas, path = sys.argv[1:4]
    with tempfile.TemporaryDirectory() as tmp:
        src = f"{tmp}/m.ptx"
        with open(src, "wb") as f:
            f.write(ptx(libnvrtc, open(path, "rb").read()))
        log = subprocess.run([ptxas, "-arch=sm_90", "-v", src, "-o", f"{tmp}/m.cubin"],
                             capture_output=True, text=True, check=True).stderr
    name = None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            name = m.group(1)
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            frame, stores, loads = m.groups()
        m = re.search(r"Used (\d+) registers", line)
        if m and name:
            print(f"{name} registers {m.group(1)} stack {frame} spill_stores {stores} spill_loads {loads}")
            name = None


main()
