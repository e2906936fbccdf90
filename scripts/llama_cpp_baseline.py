#!/usr/bin/env python3
"""CPU baseline: llama.cpp's prefill and decode tokens/s on the same GGUF as `vortex bench decode`.

Runs through llama-cpp-python (its PyPI sdist builds llama.cpp for this CPU), with the thread
count, contexts and decoded tokens of `vortex bench decode --context C --threads T`: a random
prompt of C token ids is evaluated in one call (prefill tokens/s), then DECODE single tokens
are evaluated one call each (decode tokens/s). llama.cpp keeps f16 KV; `--flash-attn` turns
its fused attention on. Set up once:

    python3 -m venv /tmp/llvenv
    CMAKE_ARGS="-DGGML_NATIVE=ON" /tmp/llvenv/bin/pip install llama-cpp-python==0.3.36
    /tmp/llvenv/bin/python scripts/llama_cpp_baseline.py ~/.cache/vortex/models/smollm2-135m.gguf
"""

import argparse
import random
import time

from llama_cpp import Llama, llama_print_system_info


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gguf")
    ap.add_argument("--context", default="512,4096", help="prompt lengths in tokens")
    ap.add_argument("--decode", type=int, default=64, help="tokens decoded after each prompt")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--flash-attn", action="store_true")
    args = ap.parse_args()
    contexts = [int(c) for c in args.context.split(",")]
    llm = Llama(
        model_path=args.gguf,
        n_ctx=max(contexts) + args.decode + 16,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        n_batch=512,
        n_ubatch=512,
        flash_attn=args.flash_attn,
        verbose=False,
    )
    print(llama_print_system_info().decode().strip())
    rng = random.Random(1)
    for ctx in contexts:
        llm.reset()  # the next eval drops the cached positions from 0 on
        tokens = [rng.randrange(1000, 30000) for _ in range(ctx)]
        t0 = time.perf_counter()
        llm.eval(tokens)
        t1 = time.perf_counter()
        for tok in tokens[: args.decode]:
            llm.eval([tok])
        t2 = time.perf_counter()
        print(
            f"llama.cpp flash_attn={args.flash_attn} context {ctx}: "
            f"prefill {ctx / (t1 - t0):.1f} tok/s, decode {args.decode / (t2 - t1):.1f} tok/s",
            flush=True,
        )


if __name__ == "__main__":
    main()
