#!/usr/bin/env bash
# After review (scratch sized by the widest launch, rows checked against what was copied,
# hand-written flows in several selections tested): every GPU suite.
cd "$(dirname "$0")"
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader > $R/machine.txt
timeout 400 ./gpu_suites.sh run . $R/suites
cd $R && tar czf $OUT/r.tgz . && cd / && rm -rf $R
