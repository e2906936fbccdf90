"""One request through a server started with --recall-every, then its selection metrics.
Usage: recall_check.py URL"""
import json, sys, urllib.request

URL = sys.argv[1]
model = json.load(urllib.request.urlopen(URL + "/v1/models"))["data"][0]["id"]
body = {"model": model, "prompt": [i % 200 + 5 for i in range(3000)], "max_tokens": 40,
        "ignore_eos": True, "temperature": 0, "vortex": {"budget": 16}}
req = urllib.request.Request(URL + "/v1/completions", json.dumps(body).encode(),
                             {"Content-Type": "application/json"})
out = json.load(urllib.request.urlopen(req, timeout=600))
print(out["usage"], out["vortex"])
for line in urllib.request.urlopen(URL + "/metrics").read().decode().splitlines():
    if line.startswith("vortex_selection"):
        print(line)
