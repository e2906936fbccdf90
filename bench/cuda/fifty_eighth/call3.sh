#!/usr/bin/env bash
# Fifty-eighth pass, call 3: the server's own accept loop (hyper's header timer) on the GPU
# host: `vortex serve --device cuda` with random Qwen3-0.6B weights answers a completion, a
# streamed chat and a stop_token_ids request, and closes a connection whose headers stall.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat $B/rev; } > $OUT/info.txt
$B/vortex serve --device cuda --random-weights qwen3-0.6b --port 18300 --flow block_topk --budget 64 > $OUT/serve.txt 2>&1 &
for i in $(seq 1 120); do curl -s localhost:18300/health > /dev/null && break; sleep 1; done
echo "ready after $i s" >> $OUT/info.txt
u=localhost:18300
curl -s $u/v1/completions -H 'content-type: application/json' -d '{"prompt":"a b c","max_tokens":8,"temperature":0}' > $OUT/completion.json
curl -sN $u/v1/chat/completions -H 'content-type: application/json' -d '{"messages":[{"role":"user","content":"hi"}],"max_tokens":8,"stream":true,"stream_options":{"include_usage":true}}' > $OUT/chat_stream.txt
curl -s $u/v1/completions -H 'content-type: application/json' -d '{"prompt":"a b c","max_tokens":8,"temperature":0,"stop_token_ids":[-1]}' > $OUT/bad_stop.json
python3 - > $OUT/stall.txt 2>&1 <<'PY'
import socket, time
s = socket.create_connection(("127.0.0.1", 18300))
s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
t = time.time(); s.settimeout(60)
try:
    data = s.recv(100)
    print("closed after %.1f s, %r" % (time.time() - t, data))
except Exception as e:
    print("still open after %.1f s: %s" % (time.time() - t, e))
PY
curl -s $u/v1/completions -H 'content-type: application/json' -d '{"prompt":"a b c","max_tokens":4,"temperature":0}' > $OUT/after.json
kill %1; wait
