#!/usr/bin/env bash
# Gemma 3 on the GPU, second build (windowed decode attention): the suites the change touches,
# the A/B of the attention kernel against the build before, and the random-weight Gemma
# geometries' decode.
set -u
B=/tmp/bins; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
xz -dc .gpu/old_vortex.xz > /tmp/old_vortex && chmod +x /tmp/old_vortex
export VORTEX_KERNEL_CACHE=/tmp/kcache
S=/tmp/suites; mkdir -p $S
start=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $S/summary.txt
suite() { local t0=$SECONDS; timeout 300 $B/$1 > $S/$1.txt 2>&1; echo "$1 rc=$? $((SECONDS-t0))s $(grep -h '^test result' $S/$1.txt | tail -1)" >> $S/summary.txt; }
for t in gpu_attention gpu_prefill gpu_graphs gpu_block_topk gpu_h2o gpu_layer_kernels gpu_fp8_weights; do suite $t & done
wait
for t in gpu_model gpu_engine; do suite $t; done
echo "suites $((SECONDS-start))s" >> $S/summary.txt
cp $S/summary.txt $OUT/summary.txt
{ for t in gpu_prefill gpu_model gpu_engine gpu_attention; do echo "== $t"; grep -E "Gemma|gemma|sliding|windowed|panicked|FAILED|test result" $S/$t.txt | cut -c1-400; done
  $B/gpu_attention windowed_decode_matches_the_cpu --nocapture 2>&1 | grep -E "windowed decode|test result" | sort -t: -k2 | tail -6; } > $OUT/lines.txt 2>&1
V=$B/vortex
{
for i in 1 2; do
  for bin in /tmp/old_vortex $V; do echo "== $bin"; timeout 40 $bin bench attention --device cuda --batch 16 --context 32k --budget 2k --iters 50 --flows block_topk 2>&1 | tail -5; done
done
timeout 60 $V bench decode --device cuda --random-weights gemma3-1b --batch 16 --context 8k,16k --decode-tokens 32 --budget 2k --flows dense,block_topk --json-out $OUT/gemma3_1b.json
timeout 80 $V bench decode --device cuda --random-weights gemma3-4b --batch 8 --context 8k,32k --decode-tokens 32 --budget 2k --flows dense,block_topk --json-out $OUT/gemma3_4b.json
} > $OUT/bench.txt 2>&1
cd $S && tar czf $OUT/logs.tgz *.txt
echo "total $((SECONDS-start))s" >> $OUT/bench.txt
