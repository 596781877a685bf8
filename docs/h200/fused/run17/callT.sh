set -u
E=$OUT/t; mkdir -p $E
which ncu; ncu --version | tail -1
export CUDA_VISIBLE_DEVICES=0
for spec in "32 4096 8 2 8 pdl" "128 2048 2 2 8 cluster"; do
  set -- $spec; tag=b$1-s$3-$6
  timeout 200 ncu --clock-control none --set full --import-source no -k regex:fused_mla_decode -s 3 -c 1 -o $E/$tag python3 .scratch/ncu/b32.py $spec > $E/$tag.log 2>&1; echo "ncu $tag exit $?"
  ncu --import $E/$tag.ncu-rep --page details > $E/$tag-details.txt 2>&1
  ncu --import $E/$tag.ncu-rep --page source --print-source sass --csv > $E/$tag-sass.csv 2>&1
  ncu --import $E/$tag.ncu-rep --page raw --csv > $E/$tag-raw.csv 2>&1
  ls -la $E; tail -3 $E/$tag.log
done
grep -E "Duration|Warp Cycles Per Issued|Issue Slots Busy|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|Stall|No Eligible" $E/b32-s8-pdl-details.txt | head -40
