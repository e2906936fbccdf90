#!/usr/bin/env bash
# Page masses on the tensor cores in blocks of 2,048 tokens (the build) against 4,096 (from
# VORTEX_PM_MMA_TOKENS in a scratch build), alternated twice; gpu_page_mass on the build; a
# block_topk server (quest and h2o beside) of this build without --recall-every and with 16,
# mixed_ab.py at 32K-token prompts against each.
cd "$(dirname "$0")" && tar xJf bins.tar.xz
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader > $R/machine.txt
for i in 1 2; do
  for t in 2048 4096; do
    echo "== tokens $t run $i" >> $R/chunk_ab.txt
    VORTEX_PM_MMA_TOKENS=$t timeout 60 ./gpu_page_mass_env --ignored page_mass_speed --nocapture 2>&1 | grep -E "^context" >> $R/chunk_ab.txt
  done
done
cat $R/chunk_ab.txt
timeout 100 ./gpu_page_mass --include-ignored --nocapture > $R/gpu_page_mass.txt 2>&1
echo "gpu_page_mass rc=$? $(grep -h '^test result' $R/gpu_page_mass.txt | tail -1)" >> $R/tests.txt
grep -E "^context" $R/gpu_page_mass.txt >> $R/tests.txt
cat $R/tests.txt
for run in "vortex none" "vortex 16"; do
  set -- $run; b=$1; every=$2
  flag=""; [ $every != none ] && flag="--recall-every $every"
  ./$b serve --device cuda --random-weights qwen3-1.7b --flow block_topk --flows quest,h2o $flag --port 8011 > $R/serve_${b}_$every.log 2>&1 &
  S=$!
  for i in $(seq 90); do curl -sf http://127.0.0.1:8011/health >/dev/null && break; sleep 1; done
  echo "$b recall-every $every" >> $R/mixed.txt
  timeout 110 python3 mixed_ab.py http://127.0.0.1:8011 32768 512 mixed >> $R/mixed.txt 2>&1
  curl -s http://127.0.0.1:8011/metrics | grep -E "^vortex_selection|^vortex_generation_tokens" >> $R/mixed.txt
  kill $S; wait $S
done
cat $R/mixed.txt
cd $R && tar czf $OUT/r.tgz . && cd / && rm -rf $R
