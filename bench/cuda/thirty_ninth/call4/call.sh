#!/usr/bin/env bash
# Every GPU suite on the committed build (749ec16): page masses on the tensor cores, the
# attention's page loop taking its score operands from mma_keys.cu.
cd "$(dirname "$0")" && tar xJf bins.tar.xz
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader > $R/machine.txt
timeout 420 ./gpu_suites.sh run . $R/suites > /dev/null 2>&1
cat $R/suites/summary.txt
cd $R && tar czf $OUT/r.tgz . && cd / && rm -rf $R
