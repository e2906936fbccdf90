# Scores a text through a running vortex server (prompt log-probabilities via echo) and asks for a
# greedy continuation; writes the JSON answers to argv[2]. argv[1]: the server's base URL.
import json, sys, time, urllib.request

base, out = sys.argv[1], sys.argv[2]
for _ in range(600):
    try:
        urllib.request.urlopen(base + "/health", timeout=2)
        break
    except Exception:
        time.sleep(1)
text = open("README.md").read()[:6000]
def post(body):
    req = urllib.request.Request(base + "/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=600))
res = {}
for flow in ["dense", "block_topk"]:
    res[flow] = post({"prompt": text, "echo": True, "logprobs": 1, "max_tokens": 24,
                      "temperature": 0, "vortex": {"flow": flow, "budget": 16}})
res["france"] = post({"prompt": "The capital of France is", "max_tokens": 16, "temperature": 0})
json.dump(res, open(out, "w"))
