#!/usr/bin/env python3
"""Decode attention baseline: PyTorch scaled_dot_product_attention on contiguous KV.

One query token per sequence, grouped-query (enable_gqa=True), bf16, for each backend PyTorch
offers (flash, cuDNN, memory-efficient), timed with CUDA events (median of --iters after
warm-up). Also a device-to-device copy through PyTorch. Writes JSON; with --vortex FILE (the
JSON of `vortex bench attention --device cuda --json-out FILE`) prints both side by side.
With --block-topk-context, also a naive block top-k step in PyTorch: page centroids (computed
once, untimed), scores q . centroid with the max over each KV group, torch.topk over the pages
between one sink and one recent page, gather of the selected pages' K and V, SDPA over them;
and the same for Quest (page min/max keys, score sum over dims of max(q kmax, q kmin)).
"""

import argparse
import json
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def time_ms(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def copy_gbps(iters):
    n = 2 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = statistics.median(time_ms(lambda: dst.copy_(src), 3, iters))
    return 2 * n / (ms * 1e-3) / 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--contexts", default="8192,32768,131072")
    ap.add_argument("--heads-q", type=int, default=32)
    ap.add_argument("--heads-kv", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--json", required=True)
    ap.add_argument("--vortex")
    ap.add_argument("--block-topk-context", type=int, default=0)
    ap.add_argument("--block-topk-budget", type=int, default=2048, help="tokens")
    ap.add_argument("--page-size", type=int, default=16)
    a = ap.parse_args()
    torch.manual_seed(0)
    dev = torch.cuda.get_device_name()
    copy = copy_gbps(20)
    print(f"{dev}; torch {torch.__version__}; copy {copy:.0f} GB/s (read + write)")
    rows = []
    backends = [
        ("flash", SDPBackend.FLASH_ATTENTION),
        ("cudnn", SDPBackend.CUDNN_ATTENTION),
        ("efficient", SDPBackend.EFFICIENT_ATTENTION),
    ]
    for ctx in [int(c) for c in a.contexts.split(",")]:
        b, hq, hk, d = a.batch, a.heads_q, a.heads_kv, a.head_dim
        q = torch.randn(b, hq, 1, d, dtype=torch.bfloat16, device="cuda")
        k = torch.randn(b, hk, ctx, d, dtype=torch.bfloat16, device="cuda")
        v = torch.randn(b, hk, ctx, d, dtype=torch.bfloat16, device="cuda")
        kv_bytes = 2 * k.numel() * k.element_size()
        ref = None
        for name, backend in backends:
            def call():
                with sdpa_kernel([backend]):
                    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            try:
                out = call()
                torch.cuda.synchronize()
            except Exception as e:  # a backend that does not take this shape
                print(f"ctx {ctx:>6} {name:<9} unsupported: {str(e).splitlines()[0][:100]}")
                rows.append({"context": ctx, "backend": name, "error": str(e)[:300]})
                continue
            if ref is None:
                ref = out.float()
            err = ((out.float() - ref).norm() / ref.norm()).item()
            ms = time_ms(call, 5, a.iters)
            med = statistics.median(ms)
            gbps = kv_bytes / (med * 1e-3) / 1e9
            rows.append({"context": ctx, "backend": name, "median_us": med * 1e3,
                         "min_us": min(ms) * 1e3, "gbps": gbps, "copy_share": gbps / copy,
                         "rel_diff_vs_first": err})
            print(f"ctx {ctx:>6} {name:<9} {med * 1e3:9.1f} us {gbps:7.0f} GB/s "
                  f"{100 * gbps / copy:5.1f}% copy (rel diff {err:.1e})")
        del q, k, v, ref
        torch.cuda.empty_cache()
    sparse = []
    if a.block_topk_context:
        sparse.append(naive_block_topk(a, a.block_topk_context, a.block_topk_budget))
        sparse.append(naive_block_topk(a, a.block_topk_context, a.block_topk_budget, quest=True))
    report = {"block_topk": sparse, "device": dev, "torch": torch.__version__, "copy_gbps": copy, "batch": a.batch,
              "heads_q": a.heads_q, "heads_kv": a.heads_kv, "head_dim": a.head_dim,
              "iters": a.iters, "rows": rows}
    with open(a.json, "w") as f:
        json.dump(report, f, indent=2)
    if a.vortex:
        compare(report, json.load(open(a.vortex)))


def naive_block_topk(a, ctx, budget, sinks=1, recent=1, quest=False):
    b, hq, hk, d, p = a.batch, a.heads_q, a.heads_kv, a.head_dim, a.page_size
    g, pages = hq // hk, ctx // p
    kept = budget // p - sinks - recent
    q = torch.randn(b, hq, 1, d, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(b, hk, ctx, d, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(b, hk, ctx, d, dtype=torch.bfloat16, device="cuda")
    cent = k.view(b, hk, pages, p, d).float().mean(3).to(torch.bfloat16)
    kmax, kmin = k.view(b, hk, pages, p, d).amax(3), k.view(b, hk, pages, p, d).amin(3)
    head = torch.arange(sinks, device="cuda").expand(b, hk, sinks)
    tail = torch.arange(pages - recent, pages, device="cuda").expand(b, hk, recent)
    kp, vp = k.view(b, hk, pages, p, d), v.view(b, hk, pages, p, d)

    def step():
        if quest:
            qg = q.view(b, hk, g, 1, d)
            sc = torch.maximum(qg * kmax[:, :, None], qg * kmin[:, :, None]).float().sum(-1).amax(2)
        else:
            sc = torch.einsum("bhgd,bhpd->bhgp", q.view(b, hk, g, d), cent).amax(2)
        idx = sc[:, :, sinks:pages - recent].topk(kept, dim=-1).indices + sinks
        idx = torch.cat([head, idx.sort(-1).values, tail], -1)
        gi = idx[..., None, None].expand(-1, -1, -1, p, d)
        ks = torch.gather(kp, 2, gi).view(b, hk, -1, d)
        vs = torch.gather(vp, 2, gi).view(b, hk, -1, d)
        return F.scaled_dot_product_attention(q, ks, vs, enable_gqa=True)

    step()
    med = statistics.median(time_ms(step, 5, a.iters))
    flow = "quest" if quest else "block_topk"
    print(f"naive PyTorch {flow} ctx {ctx} budget {budget}: {med * 1e3:.1f} us per step")
    return {"flow": flow, "context": ctx, "budget_tokens": budget, "median_us": med * 1e3}


def compare(torch_report, vortex):
    print()
    print(f"{'batch':>5} {'context':>7} {'vortex':>7} {'us':>10} {'GB/s':>6} {'%copy':>6} "
          f"{'best sdpa':>10} {'us':>9} {'GB/s':>6} {'vortex/sdpa':>11}")
    for r in vortex["rows"]:
        if not (r["best"] or r.get("default")) or r["batch"] != torch_report["batch"]:
            continue
        ok = [t for t in torch_report["rows"]
              if t["context"] == r["context"] and "median_us" in t]
        if not ok:
            continue
        t = min(ok, key=lambda t: t["median_us"])
        which = "default" if r.get("default") else "best"
        print(f"{r['batch']:>5} {r['context']:>7} {which:>7} {r['median_us']:>10.1f} {r['gbps']:>6.0f} "
              f"{100 * r['copy_share']:>5.1f}% {t['backend']:>10} {t['median_us']:>9.1f} "
              f"{t['gbps']:>6.0f} {r['median_us'] / t['median_us']:>10.3f}x")
    for r in vortex.get("block_topk", []):
        naive = [t for t in torch_report.get("block_topk", [])
                 if t["context"] == r["context"] and t["budget_tokens"] == r["budget_tokens"]
                 and t.get("flow", "block_topk") == r.get("flow", "block_topk")]
        if naive:
            t = naive[0]
            print(f"{r.get('flow', 'block_topk')} ctx {r['context']} budget {r['budget_tokens']}: vortex "
                  f"{r['step_us']:.1f} us, naive PyTorch {t['median_us']:.1f} us "
                  f"({t['median_us'] / r['step_us']:.2f}x), vortex dense {r['dense_us']:.1f} us")


if __name__ == "__main__":
    main()
