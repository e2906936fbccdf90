#!/bin/bash
# call 1: every GPU suite on b7bc8ab; target (a)'s pair; the block_topk steps
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader > $OUT/1_machine.txt
timeout 330 ./gpu_suites.sh run . $OUT/suites > /dev/null 2>&1
cp $OUT/suites/summary.txt $OUT/1_suites_summary.txt
tar czf $OUT/1_suite_logs.tgz -C $OUT suites && rm -rf $OUT/suites
cd ..
timeout 120 .gpu/vortex bench attention --device cuda --batch 16 --context 8k,32k,128k --budget 2k --flows block_topk,block_topk_fp8,quest --iters 50 --json-out $OUT/1_vortex.json > $OUT/1_attention.txt 2>&1
timeout 120 python3 scripts/sdpa_decode_bench.py --iters 50 --block-topk-context 32768 --json $OUT/1_sdpa.json --vortex $OUT/1_vortex.json > $OUT/1_sdpa.txt 2>&1
echo done
