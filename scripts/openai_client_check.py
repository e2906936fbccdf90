#!/usr/bin/env python3
"""The `openai` Python client against a running `vortex serve`: one call of each kind a client
makes (models, chat, streaming with usage, n with a seed, logprobs, completions with echo and
stop, JSON and JSON Schema output, the client's `parse`, tools, a flow per request) and the
errors it should raise (404, 400, 401). Prints OK or ERR and what came back, a line each; the
ERR lines listed below are the expected ones. Tools need a model whose chat template has a
tool-call format (Qwen2.5's); a sampled reply cut short by `max_tokens` keeps an unfinished call
in its content (docs/SERVING.md), so the forced calls are greedy.

    pip install openai
    vortex serve --port 8123 --model qwen2.5-coder-0.5b --flows block_topk,quest --api-key sekrit
    python3 scripts/openai_client_check.py [BASE_URL] [API_KEY]

Expected ERR lines: models.retrieve missing (404), bad param (400), bad model (404), unknown field
(400), reasoning_effort (400: an unknown field), wrong key (401), store true (400).
"""
import sys

import openai

BASE = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8123/v1"
KEY = sys.argv[2] if len(sys.argv) > 2 else "sekrit"
c = openai.OpenAI(base_url=BASE, api_key=KEY)
def show(name, f):
    try:
        r = f()
        print("OK ", name, "|", r if isinstance(r, str) else repr(r)[:300])
    except Exception as e:
        print("ERR", name, "|", type(e).__name__, str(e)[:300])
ms = c.models.list()
show("models", lambda: [m.id for m in ms.data])
mid = ms.data[0].id
show("models.retrieve", lambda: c.models.retrieve(mid).id)
show("models.retrieve missing", lambda: c.models.retrieve("nope").id)
show("chat", lambda: c.chat.completions.create(model=mid, messages=[{"role":"user","content":"Say hi"}], max_tokens=12).choices[0].message.content)
def stream():
    s = c.chat.completions.create(model=mid, messages=[{"role":"user","content":"Count to five"}], max_tokens=20, stream=True, stream_options={"include_usage": True})
    parts=[]; usage=None; fr=None
    for ch in s:
        if ch.usage: usage=ch.usage
        for chc in ch.choices:
            if chc.delta.content: parts.append(chc.delta.content)
            if chc.finish_reason: fr=chc.finish_reason
    return f"{''.join(parts)!r} finish={fr} usage={usage}"
show("chat stream", stream)
show("chat n=3 seed", lambda: [x.message.content for x in c.chat.completions.create(model=mid, messages=[{"role":"user","content":"Name a fruit"}], max_tokens=8, n=3, temperature=1.0, seed=7).choices])
show("chat logprobs", lambda: c.chat.completions.create(model=mid, messages=[{"role":"user","content":"Hi"}], max_tokens=3, logprobs=True, top_logprobs=2).choices[0].logprobs.content[0])
show("completion", lambda: c.completions.create(model=mid, prompt="The capital of France is", max_tokens=8, temperature=0).choices[0].text)
show("completion echo logprobs", lambda: c.completions.create(model=mid, prompt="Paris is", max_tokens=0, echo=True, logprobs=1).choices[0].logprobs.token_logprobs)
show("completion stop", lambda: c.completions.create(model=mid, prompt="1, 2, 3,", max_tokens=20, temperature=0, stop=[" 6"]).choices[0])
show("json_object", lambda: c.chat.completions.create(model=mid, messages=[{"role":"user","content":"Give a JSON object with a name"}], max_tokens=40, response_format={"type":"json_object"}).choices[0].message.content)
schema={"type":"object","properties":{"city":{"type":"string"},"pop":{"type":"integer"}},"required":["city","pop"],"additionalProperties":False}
show("json_schema", lambda: c.chat.completions.create(model=mid, messages=[{"role":"user","content":"A city"}], max_tokens=60, response_format={"type":"json_schema","json_schema":{"name":"c","schema":schema,"strict":True}}).choices[0].message.content)
tools=[{"type":"function","function":{"name":"get_weather","description":"Weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]
show("tools required", lambda: c.chat.completions.create(model=mid, messages=[{"role":"user","content":"Weather in Paris?"}], max_tokens=60, tools=tools, tool_choice="required", temperature=0).choices[0].message.tool_calls)
show("tools named", lambda: c.chat.completions.create(model=mid, messages=[{"role":"user","content":"Weather in Paris?"}], max_tokens=60, tools=tools, tool_choice={"type":"function","function":{"name":"get_weather"}}).choices[0])
show("flow per request", lambda: c.chat.completions.create(model=mid, messages=[{"role":"user","content":"Hi"}], max_tokens=5, extra_body={"vortex":{"flow":"quest"}}).choices[0].message.content)
show("bad param", lambda: c.chat.completions.create(model=mid, messages=[{"role":"user","content":"Hi"}], max_tokens=5, temperature=-1))
show("bad model", lambda: c.chat.completions.create(model="gpt-4", messages=[{"role":"user","content":"Hi"}], max_tokens=5))
show("unknown field", lambda: c.chat.completions.create(model=mid, messages=[{"role":"user","content":"Hi"}], max_tokens=5, extra_body={"frobnicate":1}))
show("parallel_tool_calls", lambda: c.chat.completions.create(model=mid, messages=[{"role":"user","content":"Hi"}], max_tokens=5, tools=tools, parallel_tool_calls=False).choices[0].message.content)
show("reasoning_effort", lambda: c.chat.completions.create(model=mid, messages=[{"role":"user","content":"Hi"}], max_tokens=5, reasoning_effort="low").choices[0].message.content)
show("max_completion_tokens", lambda: c.chat.completions.create(model=mid, messages=[{"role":"user","content":"Hi"}], max_completion_tokens=5).usage)
show("stop str", lambda: c.chat.completions.create(model=mid, messages=[{"role":"user","content":"Hi"}], max_tokens=5, stop="x").choices[0].finish_reason)
show("user/frequency", lambda: c.chat.completions.create(model=mid, messages=[{"role":"user","content":"Hi"}], max_tokens=5, user="u1", frequency_penalty=0.5, presence_penalty=0.2, logit_bias={"1":-100}).choices[0].message.content)
show("system+developer", lambda: c.chat.completions.create(model=mid, messages=[{"role":"developer","content":"Be short"},{"role":"user","content":[{"type":"text","text":"Hi"}]}], max_tokens=5).choices[0].message.content)
show("wrong key", lambda: openai.OpenAI(base_url=BASE, api_key=KEY + "x").models.list())
show("tool message roundtrip", lambda: c.chat.completions.create(model=mid, messages=[{"role":"user","content":"Weather?"},{"role":"assistant","content":None,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},{"role":"tool","tool_call_id":"call_1","content":"sunny"}], max_tokens=10, tools=tools).choices[0].message.content)
show("stream tools", lambda: [ (ch.choices[0].delta.tool_calls if ch.choices else None) for ch in c.chat.completions.create(model=mid, messages=[{"role":"user","content":"Weather in Paris?"}], max_tokens=40, tools=tools, tool_choice="required", stream=True, temperature=0)][:4])
show("logprobs completions stream", lambda: [ch.choices[0].logprobs for ch in c.completions.create(model=mid, prompt="Hi", max_tokens=2, logprobs=1, stream=True)][:2])
show("store true", lambda: c.chat.completions.create(model=mid, messages=[{"role":"user","content":"Hi"}], max_tokens=5, store=True))
show("metadata", lambda: c.chat.completions.create(model=mid, messages=[{"role":"user","content":"Hi"}], max_tokens=5, metadata={"a":"b"}).id)
show("response_format text", lambda: c.chat.completions.create(model=mid, messages=[{"role":"user","content":"Hi"}], max_tokens=5, response_format={"type":"text"}).choices[0].message.content)
show("structured parse", lambda: c.beta.chat.completions.parse(model=mid, messages=[{"role":"user","content":"A city"}], max_tokens=60, response_format={"type":"json_schema","json_schema":{"name":"c","schema":schema,"strict":True}}).choices[0].message.content)
