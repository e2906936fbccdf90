#!/usr/bin/env bash
# Gemma 3 270M's real weights on the GPU: the parts carried earlier are joined in /tmp/g.
set -u
cat /tmp/g/part0 /tmp/g/part1 /tmp/g/part2 /tmp/g/part3 /tmp/g/part4 /tmp/g/part5 > /tmp/g/m.gguf
sha256sum /tmp/g/m.gguf > $OUT/real.txt
B=/tmp/bins
export VORTEX_KERNEL_CACHE=/tmp/kcache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> $OUT/real.txt
$B/vortex serve --device cuda --model /tmp/g/m.gguf --port 8123 --flows dense,block_topk > $OUT/serve.txt 2>&1 &
timeout 200 python3 .gpu/real/score.py http://127.0.0.1:8123 $OUT/gpu_real.json >> $OUT/real.txt 2>&1
echo "score rc=$?" >> $OUT/real.txt
kill %1; wait
timeout 200 $B/vortex bench decode --device cuda --model /tmp/g/m.gguf --batch 16 --context 8k,32k --budget 2k --decode-tokens 32 --flows dense,block_topk --json-out $OUT/bench.json >> $OUT/real.txt 2>&1
echo "bench rc=$?" >> $OUT/real.txt
