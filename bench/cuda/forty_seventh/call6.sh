#!/usr/bin/env bash
# Call 6: pages in steps run the prefetching 8-warp build for every table; suites, then Gemma 3
# steps (build before / this one, alternated) and Gemma-geometry attention.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $OUT/info.txt
S=$OUT/suites; mkdir -p $S
suite() { local t0=$SECONDS; timeout 200 $B/$1 > $S/$1.txt 2>&1; echo "$1 rc=$? $((SECONDS-t0))s $(grep -h '^test result' $S/$1.txt | tail -1)" >> $OUT/info.txt; }
suite gpu_attention & suite gpu_graphs & wait
suite gpu_model; suite gpu_engine
grep -hE "panicked|FAILED" $S/*.txt | head -20 >> $OUT/info.txt
for round in 1 2 3; do for v in vortex_old vortex; do
  for g in gemma3-270m gemma3-1b; do
    echo "== $round $v $g" >> $OUT/bench.txt
    timeout 60 $B/$v bench decode --device cuda --random-weights $g --batch 16 --context 8k --decode-tokens 32 --flows dense,block_topk >> $OUT/bench.txt 2>&1
  done
done; done
echo "== vortex attention 4 1 256" >> $OUT/att.txt
timeout 90 $B/vortex bench attention --device cuda --heads-q 4 --heads-kv 1 --head-dim 256 --batch 16 --context 512,8k,32k --flows dense --iters 30 >> $OUT/att.txt 2>&1
timeout 100 ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base --launch-count 3000 \
  $B/vortex bench decode --device cuda --random-weights gemma3-270m --batch 16 --context 8k --decode-tokens 4 --flows dense 2>/dev/null | grep '^"' | gzip > $OUT/ncu_new.csv.gz
tar czf $OUT/suites.tgz -C $OUT suites && rm -rf $S
