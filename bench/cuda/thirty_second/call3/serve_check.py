import json, sys, time, urllib.request, concurrent.futures as cf
URL = sys.argv[1]
MAX = int(sys.argv[2]) if len(sys.argv) > 2 else 128
MODEL = json.load(urllib.request.urlopen(URL + "/v1/models"))["data"][0]["id"]
def post(body):
    req = urllib.request.Request(URL + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    t = time.time()
    with urllib.request.urlopen(req, timeout=120) as r:
        out = json.load(r)
    return time.time() - t, out
def body(i, fmt):
    b = {"model": MODEL, "prompt": "Write some JSON about city %d:" % i, "max_tokens": MAX,
         "temperature": 0.8, "seed": i, "ignore_eos": True}
    if fmt: b["response_format"] = {"type": "json_object"}
    return b
post(body(0, False)); post(body(0, True))  # warm-up
for fmt in [False, True, False, True]:
    dt, out = post(body(1, fmt))
    c = out["choices"][0]; n = out["usage"]["completion_tokens"]
    ok = None
    if fmt:
        try: json.loads(c["text"]); ok = "parses"
        except Exception as e: ok = "prefix only" if c["finish_reason"] == "length" else "INVALID: %s" % e
    print(f"alone json_object={fmt}: {n} tokens in {dt*1000:.0f} ms, {dt*1000/max(n,1):.2f} ms/token, finish {c['finish_reason']}, {ok}, text {c['text'][:80]!r}")
for label, fmts in [("16 plain", [False]*16), ("8 plain + 8 json_object", [False, True]*8)]:
    t = time.time()
    with cf.ThreadPoolExecutor(16) as ex:
        res = list(ex.map(lambda a: post(body(a[0], a[1])), enumerate(fmts)))
    dt = time.time() - t
    toks = sum(o["usage"]["completion_tokens"] for _, o in res)
    print(f"{label}: {toks} tokens in {dt*1000:.0f} ms, {toks/dt:.0f} tokens/s")
