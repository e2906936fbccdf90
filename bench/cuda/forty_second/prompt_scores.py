"""Times completion requests of one long prompt on a running server: plain (max_tokens 1),
and echoed with prompt log-probabilities (max_tokens 0, logprobs 1 and 5). Each run's prompt
differs from every other's in its first token, so no run takes pages from the prefix cache."""
import json, sys, time, urllib.request

url = sys.argv[1]
def post(body):
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=300) as r:
        out = json.loads(r.read())
    return time.perf_counter() - t, out

for _ in range(600):
    try:
        urllib.request.urlopen(url + "/health", timeout=2); break
    except Exception:
        time.sleep(0.5)
print("| prompt tokens | request | median s | runs s | prompt logprobs |")
print("|---|---|---|---|---|")
runs = 0
for n in [1024, 4096, 16384]:
    base = [1000 + (i * 7919) % 9000 for i in range(n)]
    cases = [("max_tokens 1", {"max_tokens": 1}),
             ("echo, logprobs 1, max_tokens 0", {"max_tokens": 0, "echo": True, "logprobs": 1}),
             ("echo, logprobs 5, max_tokens 0", {"max_tokens": 0, "echo": True, "logprobs": 5})]
    for name, extra in cases:
        times, got = [], "-"
        for run in range(4):
            runs += 1
            prompt = [10 + runs] + base[1:]
            dt, out = post({"prompt": prompt, "temperature": 0, **extra})
            times.append(dt)
            lp = out["choices"][0].get("logprobs")
            if lp:
                tl = lp["token_logprobs"]
                got = f"{len(tl)} ({sum(x is None for x in tl)} null), second {tl[2]:.3f}"
        times = times[1:]
        times.sort()
        print(f"| {n} | {name} | {times[len(times)//2]:.3f} | {' / '.join(f'{t:.3f}' for t in times)} | {got} |", flush=True)
