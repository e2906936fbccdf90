# Sums one decode step's kernels from an ncu CSV (gpu__time_duration.sum per launch, gzipped):
# the launches from one embed_rows to the next, grouped by kernel and grid. Usage: ncu_step.py F.csv.gz
import collections, csv, gzip, sys

rows = list(csv.reader(gzip.open(sys.argv[1], "rt")))
hdr = rows[0]
rows = [dict(zip(hdr, x)) for x in rows[1:]]
seq = [(x["Kernel Name"][:50], x["Grid Size"], x["Block Size"],
        float(x["Metric Value"].replace(",", "")) / 1000) for x in rows]
starts = [i for i, s in enumerate(seq) if s[0].startswith("embed")]
a, b = starts[-2], starts[-1]
print("step kernels", b - a, "sum us %.1f" % sum(s[3] for s in seq[a:b]))
agg = collections.OrderedDict()
for s in seq[a:b]:
    v = agg.setdefault(s[:3], [0, 0.0])
    v[0] += 1
    v[1] += s[3]
for k, v in sorted(agg.items(), key=lambda kv: -kv[1][1])[:8]:
    print("%4d %8.1f us  %6.2f avg  %s %s %s" % (v[0], v[1], v[1] / v[0], *k))
