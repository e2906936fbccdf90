#!/usr/bin/env python3
"""Markdown table of a bench_serve_sweep.sh run: one row per rate and flow."""
import json
import pathlib
import sys

out = pathlib.Path(sys.argv[1])
rows = []
for path in sorted(out.glob("*.json")):
    data = json.loads(path.read_text())
    flow = path.stem.rsplit("-", 1)[0]
    for lv in data["levels"]:
        s = lv["summary"] if "summary" in lv else lv
        rate = s["rate"]
        rows.append((float("inf") if rate == "inf" else float(rate), flow, s))
order = {"dense": 0}
rows.sort(key=lambda r: (r[0], order.get(r[1], 1), r[1]))
print("| offered req/s | flow | done/errors | req/s | output tok/s | TTFT p50 / p95 (s) | TPOT mean / p50 / p95 (ms) | E2E p95 (s) |")
print("|---|---|---|---|---|---|---|---|")
for rate, flow, s in rows:
    t, p, e = s["ttft_ms"], s["tpot_ms"], s["e2e_ms"]
    print(
        f"| {s['rate']} | {flow} | {s['completed']}/{s['errors']} | {s['request_throughput']:.4f} "
        f"| {s['output_throughput']:.2f} | {t['p50'] / 1e3:.1f} / {t['p95'] / 1e3:.1f} "
        f"| {p['mean']:.0f} / {p['p50']:.0f} / {p['p95']:.0f} | {e['p95'] / 1e3:.1f} |"
    )
