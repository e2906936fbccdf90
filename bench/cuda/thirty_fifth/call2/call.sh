#!/usr/bin/env bash
cd "$(dirname "$0")"
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader > $R/machine.txt
timeout 200 ./gpu_model gpu_model_decodes_sequences_of_several_flows --nocapture > $R/gpu_model_flows.txt 2>&1; echo "rc=$?" >> $R/gpu_model_flows.txt
timeout 100 ./gpu_engine several_flows --nocapture > $R/gpu_engine_flows.txt 2>&1; echo "rc=$?" >> $R/gpu_engine_flows.txt
grep -h "errors\|rc=\|panicked\|worst" $R/gpu_model_flows.txt | tail -60
tail -20 $R/gpu_engine_flows.txt
cd $R && tar czf $OUT/r.tgz . && cd / && rm -rf $R
