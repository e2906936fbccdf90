"""Requests that choose their own flow on one GPU server, decoding in the same steps: 16
streamed completions sent at once, each a prompt of CONTEXT random token ids and MAX_TOKENS
new tokens, with the flows of each mix spread over them. Prints, per mix, the streamed chunks
(one a token, one a decode step) a second while all 16 decode together (from the last first
token to the first end) and the mean time per output token.
The first mix warms the server up; each mix runs once.
Usage: mixed_ab.py URL [CONTEXT] [MAX_TOKENS] [mixed]: with `mixed`, block_topk alone and the
two mixes only."""
import json, random, sys, time, urllib.request, concurrent.futures as cf

URL = sys.argv[1]
CONTEXT = int(sys.argv[2]) if len(sys.argv) > 2 else 8192
MAX = int(sys.argv[3]) if len(sys.argv) > 3 else 128
MODEL = json.load(urllib.request.urlopen(URL + "/v1/models"))["data"][0]["id"]
MIXES = [
    ("warm-up", ["block_topk"] * 16),
    ("16 block_topk", ["block_topk"] * 16),
    ("8 block_topk + 8 quest", ["block_topk", "quest"] * 8),
    ("16 quest", ["quest"] * 16),
    ("8 block_topk + 8 h2o", ["block_topk", "h2o"] * 8),
    ("16 h2o", ["h2o"] * 16),
]
if sys.argv[4:] == ["mixed"]:
    MIXES = [m for m in MIXES if m[0] in ("warm-up", "16 block_topk") or "+" in m[0]]


def stream(i, flow):
    rng = random.Random(i)
    prompt = [rng.randrange(256, 1000) for _ in range(CONTEXT)]
    body = {"model": MODEL, "prompt": prompt, "max_tokens": MAX, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
            "vortex": {"flow": flow}}
    req = urllib.request.Request(URL + "/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    first = None
    n = 0
    times = []
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.strip()
            if not line.startswith(b"data:") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if chunk.get("usage"):
                n = chunk["usage"]["completion_tokens"]
            if chunk["choices"]:
                times.append(time.time())
    return times[0], time.time(), n, times


for label, flows in MIXES:
    with cf.ThreadPoolExecutor(16) as ex:
        res = list(ex.map(lambda a: stream(*a), enumerate(flows)))
    # From the last first token to the first end, all 16 requests decode (no prefill beside).
    start = max(r[0] for r in res)
    stop = min(r[1] for r in res)
    chunks = sum(sum(1 for t in r[3] if start < t <= stop) for r in res)
    tpot = sum((e - f) / max(n - 1, 1) for f, e, n, _ in res) / len(res)
    tokens = sum(r[2] for r in res)
    print(f"{label}: {tokens} tokens; all decoding: {chunks} streamed chunks in "
          f"{stop - start:.2f} s, {chunks / (stop - start):.0f} a second; mean time per output "
          f"token {tpot * 1000:.2f} ms", flush=True)
