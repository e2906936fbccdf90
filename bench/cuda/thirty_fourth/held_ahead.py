"""Requests held to a JSON schema on a GPU server, against free ones: output tokens/s of a
batch sent at once, and the server's steps decoded ahead. Usage: held_ahead.py URL [MAX_TOKENS]

The schema's one string must be at least 4000 characters long (30 a token past 133 tokens),
so no reply closes its object within MAX_TOKENS: every request runs to its length, held the
whole way."""
import json, re, sys, time, urllib.request, concurrent.futures as cf

URL = sys.argv[1]
MAX = int(sys.argv[2]) if len(sys.argv) > 2 else 128
MODEL = json.load(urllib.request.urlopen(URL + "/v1/models"))["data"][0]["id"]
SCHEMA = {"type": "object",
          "properties": {"text": {"type": "string", "minLength": max(4000, 30 * MAX)}},
          "required": ["text"], "additionalProperties": False}


def post(body):
    req = urllib.request.Request(URL + "/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    t = time.time()
    with urllib.request.urlopen(req, timeout=300) as r:
        out = json.load(r)
    return time.time() - t, out


def body(i, held):
    b = {"model": MODEL, "prompt": "Write a long story about city %d:" % i, "max_tokens": MAX,
         "temperature": 0.8, "seed": i, "ignore_eos": True}
    if held:
        b["response_format"] = {"type": "json_schema",
                                "json_schema": {"name": "story", "schema": SCHEMA}}
    return b


def ahead():
    text = urllib.request.urlopen(URL + "/metrics").read().decode()
    m = re.search(r"^vortex_decode_steps_ahead_total (\d+)", text, re.M)
    return int(m.group(1)) if m else -1


post(body(0, False))
post(body(0, True))
for label, helds in [("16 free", [False] * 16), ("16 held", [True] * 16),
                     ("8 free + 8 held", [False, True] * 8)] * 2:
    before = ahead()
    t = time.time()
    with cf.ThreadPoolExecutor(16) as ex:
        res = list(ex.map(lambda a: post(body(a[0] + 1, a[1])), enumerate(helds)))
    dt = time.time() - t
    toks = sum(o["usage"]["completion_tokens"] for _, o in res)
    ends = sorted({o["choices"][0]["finish_reason"] for _, o in res})
    prefix = all(o["choices"][0]["text"].startswith('{') for (_, o), h in zip(res, helds) if h)
    print(f"{label}: {toks} tokens in {dt * 1000:.0f} ms, {toks / dt:.0f} tokens/s, "
          f"{ahead() - before} steps ahead, ends {ends}, held replies open an object: {prefix}",
          flush=True)
