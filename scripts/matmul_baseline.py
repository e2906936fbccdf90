#!/usr/bin/env python3
"""Decode-step matrix products in PyTorch (cuBLAS) for the random-weight geometries.

For Qwen3-1.7B and Qwen3-8B at batch 16 and 64: each layer's products (q|k|v, o, gate|up,
down) and the output head, bf16 activations times bf16 weights, timed as 20 launches replayed
from a CUDA graph (median of 20 replays, after warm-up). Weights are cycled through about 200 MB
of copies so the L2 does not hold them. Prints each product and the per-step sum with its
weight bandwidth: a baseline for the matmul part of `vortex bench decode --device cuda`.
"""

import torch

MODELS = {
    "qwen3-1.7b": (28, [(4096, 2048), (2048, 2048), (12288, 2048), (2048, 6144)], (151936, 2048)),
    "qwen3-8b": (36, [(6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288)], (151936, 4096)),
}


def graph_us(f, launches=20, replays=20):
    for _ in range(10):
        f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(launches):
            f()
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(replays):
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / launches * 1000)
    times.sort()
    return times[len(times) // 2]


def main():
    for name, (layers, shapes, head) in MODELS.items():
        for m in (16, 64):
            total, weight_bytes = 0.0, 0
            for n, k in shapes + [head]:
                reps = 1 if (n, k) == head else layers
                copies = max(1, int(200e6 // (n * k * 2)))
                ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                turn = [0]

                def product():
                    turn[0] += 1
                    return torch.matmul(x, ws[turn[0] % copies].t())

                us = graph_us(product)
                print(f"{name} batch {m}: [{m} x {k}] x [{n} x {k}]^T {us:.1f} us ({n * k * 2 / us / 1e3:.0f} GB/s)")
                total += us * reps
                weight_bytes += n * k * 2 * reps
                del ws
            print(
                f"== {name} batch {m}: {total / 1000:.3f} ms of products a step, "
                f"{weight_bytes / 1e9:.2f} GB of weights, {weight_bytes / total / 1e3:.0f} GB/s"
            )
    print("torch", torch.__version__)


if __name__ == "__main__":
    main()
