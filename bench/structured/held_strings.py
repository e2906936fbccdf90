import json, time, urllib.request
import sys
URL = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000"
def chat(content, schema):
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 120, "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
    req = urllib.request.Request(URL + "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    t = time.time()
    out = json.load(urllib.request.urlopen(req, timeout=300))
    dt = time.time() - t
    c = out["choices"][0]
    n = out["usage"]["completion_tokens"]
    print(f"{n} tokens in {dt:.2f} s ({dt*1000/max(n,1):.1f} ms/token), finish {c['finish_reason']}: {c['message']['content']}")
person = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 20},
    "email": {"type": "string", "format": "email"},
    "birthday": {"type": "string", "format": "date"},
    "phone": {"type": "string", "pattern": "^\\+[0-9]{1,3} [0-9]{3} [0-9]{3} [0-9]{4}$"},
    "id": {"type": "string", "format": "uuid"}},
  "required": ["name", "email", "birthday", "phone", "id"], "additionalProperties": False}
chat("Invent a person record for a customer database, in JSON.", person)
chat("Describe Ada Lovelace as a customer record in JSON.", person)
slug = {"type": "object", "properties": {"slug": {"type": "string", "pattern": "^[a-z]+(-[a-z]+)*$", "maxLength": 24},
    "title": {"type": "string", "minLength": 5, "maxLength": 40}}, "required": ["slug", "title"], "additionalProperties": False}
chat("Suggest a blog post about sparse attention, in JSON with a URL slug and a title.", slug)
free = {"type": "object", "properties": {"slug": {"type": "string"}, "title": {"type": "string"}}, "required": ["slug", "title"], "additionalProperties": False}
chat("Suggest a blog post about sparse attention, in JSON with a URL slug and a title.", free)
