"""Completions that ask for log-probabilities on a GPU server, against the same without them:
output tokens/s of 16 requests sent at once. Usage: logprobs.py URL [MAX_TOKENS]"""
import json, sys, time, urllib.request, concurrent.futures as cf

URL = sys.argv[1]
MAX = int(sys.argv[2]) if len(sys.argv) > 2 else 128
MODEL = json.load(urllib.request.urlopen(URL + "/v1/models"))["data"][0]["id"]


def post(body):
    req = urllib.request.Request(URL + "/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.load(r)


def body(i, logprobs, temperature):
    b = {"model": MODEL, "prompt": "Tell a story about city %d:" % i, "max_tokens": MAX,
         "temperature": temperature, "seed": i, "ignore_eos": True}
    if logprobs:
        b["logprobs"] = 5
    return b


post(body(0, False, 0.0))
post(body(0, True, 0.0))
for label, lp, t in [("greedy", False, 0.0), ("greedy, logprobs 5", True, 0.0),
                     ("temperature 0.8", False, 0.8), ("temperature 0.8, logprobs 5", True, 0.8)] * 2:
    start = time.time()
    with cf.ThreadPoolExecutor(16) as ex:
        res = list(ex.map(lambda i: post(body(i + 1, lp, t)), range(16)))
    dt = time.time() - start
    toks = sum(o["usage"]["completion_tokens"] for o in res)
    lps = res[0]["choices"][0].get("logprobs")
    shown = (lps["token_logprobs"][:2], lps["top_logprobs"][0]) if lps else None
    print(f"{label}: {toks} tokens in {dt * 1000:.0f} ms, {toks / dt:.0f} tokens/s; "
          f"first reply's logprobs {shown}", flush=True)
