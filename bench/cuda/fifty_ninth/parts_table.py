"""Index phase and dependent step (us, the default attention build) by blocks a row, from the
JSON reports of `vortex bench attention --device cuda --index-parts P --json-out FILE`.

    python3 parts_table.py LABEL=FILE [LABEL=FILE ...]
"""
import json
import sys

cols = []
table = {}
dense = {}
for arg in sys.argv[1:]:
    label, path = arg.split("=", 1)
    cols.append(label)
    report = json.load(open(path))
    for r in report["block_topk"]:
        if not r["default"]:
            continue
        key = (r["flow"], r["batch"], r["context"])
        table.setdefault(key, {})[label] = r
        dense[key] = r["dense_us"]
print("flow batch context dense | " + " | ".join(f"{c}: parts index dep" for c in cols))
for key in sorted(table):
    cells = []
    for c in cols:
        r = table[key].get(c)
        cells.append(f"{r['index_parts']} {r['index_us']:.1f} {r['step_dependent_us']:.1f}" if r else "-")
    print(f"{key[0]} {key[1]} {key[2]} {dense[key]:.1f} | " + " | ".join(cells))
