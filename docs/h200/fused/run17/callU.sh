set -u
E=$OUT/u; mkdir -p $E
export CUDA_VISIBLE_DEVICES=0
timeout 300 python3 .scratch/cuda_variants_u.py $E/variants21.json > $E/variants.log 2>&1; echo "variants exit $?"
tail -3 $E/variants.log | cut -c1-300
python3 -c "
import json; rows=json.load(open('$E/variants21.json'))
keys=[k for k in rows[0] if k.startswith('b')]
for k in keys: print(k.ljust(34), ' '.join(str(r.get(k)).rjust(8) for r in rows))
for r in rows: print(r['variant'], {k: v for k, v in r.items() if k.startswith('err') or k.startswith('regs')})
"
