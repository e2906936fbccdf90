f=$1
out=$(python3 /tmp/ptxv.py $f 2>&1)
echo "$out" | awk -v f=$(basename $f .cu) '/Compiling entry function/ {fn=$7} /spill stores/ {if ($5+0>0) print f, fn, $1" B stack", $5" B spill st", $9" B spill ld"}'
