import json, time, urllib.request
import sys
URL = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000"
tools = [
 {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
   "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city"], "additionalProperties": False}}},
 {"type": "function", "function": {"name": "set_alarm", "description": "Set an alarm",
   "parameters": {"type": "object", "properties": {"hour": {"type": "integer", "minimum": 0, "maximum": 23}, "minute": {"type": "integer", "minimum": 0, "maximum": 59}}, "required": ["hour", "minute"], "additionalProperties": False}}}]
def ask(content, choice, parallel=True):
    body = {"messages": [{"role": "user", "content": content}], "tools": tools, "tool_choice": choice,
            "parallel_tool_calls": parallel, "temperature": 0, "max_tokens": 150}
    req = urllib.request.Request(URL + "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    t = time.time(); out = json.load(urllib.request.urlopen(req, timeout=300)); dt = time.time() - t
    c = out["choices"][0]
    calls = [(x["function"]["name"], x["function"]["arguments"]) for x in c["message"].get("tool_calls") or []]
    print(f"{content!r} choice={choice} parallel={parallel}: {out['usage']['completion_tokens']} tokens, {dt:.2f} s, finish {c['finish_reason']}, calls {calls}, content {c['message']['content']!r}")
ask("What's the weather in Paris and in Rome?", "required")
ask("What's the weather in Paris and in Rome?", "required", False)
ask("Wake me up at 7:30 and tell me the weather in Berlin.", "required")
ask("Wake me up at 7:30.", "required")
ask("What's the weather in Paris and in Rome?", "auto")
