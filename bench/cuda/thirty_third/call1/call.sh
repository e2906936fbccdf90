#!/usr/bin/env bash
cd "$(dirname "$0")"
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader > $R/machine.txt
timeout 360 ./gpu_suites.sh run . $R/suites
timeout 150 ./vortex bench attention --device cuda --batch 16 --context 8k,32k,128k --budget 2k --flows block_topk,block_topk_fp8,quest --iters 50 --json-out $R/vortex.json > $R/bench_attention.txt 2>&1
timeout 150 python3 sdpa_decode_bench.py --iters 50 --block-topk-context 32768 --json $R/sdpa.json --vortex $R/vortex.json > $R/sdpa.txt 2>&1
cd $R && tar czf $OUT/r.tgz . && cd / && rm -rf $R
