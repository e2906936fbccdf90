#!/usr/bin/env bash
# Sixty-first pass, call 2: every GPU suite on the build whose generated kernels widen an fp8
# pair at once and whose hand-written fp8 scorers load 16 bytes a lane; the fp8 flows' steps
# with this build and 5240461's (`vortex_old`) alternated, streaming (the sparse attention
# alone) beside them; Nsight Compute's sections for quest_fp8's index kernel and the sparse
# attention at batch 16, 32K; then the generated index phases of renamed copies of
# block_topk_fp8 and quest_fp8, both builds.
set -u
B=/tmp/bins; rm -rf $B; mkdir -p $B && tar xJf .gpu/bins.tar.xz -C $B
export VORTEX_KERNEL_CACHE=/tmp/kcache RUST_TEST_NOCAPTURE=1
R=$OUT/r; mkdir -p $R
save() { tar czf $OUT/call2.tgz -C $OUT r; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat $B/rev; } > $R/info.txt
timeout 170 scripts/gpu_suites.sh run $B $R/suites > /dev/null 2>&1
echo "suites rc=$? $SECONDS s" >> $R/info.txt; save
for run in new old new2 old2; do
  bin=$B/vortex; fl=streaming,block_topk_fp8,quest_fp8
  case $run in old*) bin=$B/vortex_old; fl=block_topk_fp8,quest_fp8;; esac
  timeout 50 $bin bench attention --device cuda --batch 16 --context 32k --budget 2k --iters 50 --launches-per-timing 10 --flows $fl --json-out $R/fp8_$run.json > $R/fp8_$run.txt 2>&1
  echo "fp8 flows $run rc=$? $SECONDS s" >> $R/info.txt; save
done
S="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats"
timeout 70 ncu --clock-control none $S -k regex:index_select --launch-count 1 $B/vortex bench attention --device cuda --batch 16 --context 32k --budget 2k --iters 3 --flows quest_fp8 > $R/ncu_index.txt 2>&1
echo "ncu index rc=$? $SECONDS s" >> $R/info.txt; save
timeout 70 ncu --clock-control none $S -k regex:paged_decode_ready --launch-count 6 $B/vortex bench attention --device cuda --batch 16 --context 32k --budget 2k --iters 3 --flows quest_fp8 > $R/ncu_attention.txt 2>&1
echo "ncu attention rc=$? $SECONDS s" >> $R/info.txt; save
F=bench/cuda/fiftieth/block_topk_fp8_custom.flow,bench/cuda/forty_eighth/quest_fp8_custom.flow
for run in new old; do
  bin=$B/vortex; case $run in old*) bin=$B/vortex_old;; esac
  timeout 45 $bin bench attention --device cuda --batch 1,4,16 --context 32k --budget 2k --iters 20 --flows $F --launches-per-timing 10 --json-out $R/gen_$run.json > $R/gen_$run.txt 2>&1
  echo "generated $run rc=$? $SECONDS s" >> $R/info.txt; save
done
python3 bench/cuda/fifty_ninth/parts_table.py old=$R/gen_old.json new=$R/gen_new.json > $R/gen_table.txt 2>&1
python3 bench/cuda/fifty_ninth/parts_table.py old=$R/fp8_old.json new=$R/fp8_new.json old2=$R/fp8_old2.json new2=$R/fp8_new2.json > $R/fp8_table.txt 2>&1
save
cat $R/info.txt $R/suites/summary.txt $R/gen_table.txt $R/fp8_table.txt; grep -E "streaming|quest_fp8|block_topk_fp8" $R/fp8_new.txt | grep default
