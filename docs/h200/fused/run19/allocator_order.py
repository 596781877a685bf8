"""Why fused_fp8's attn_us at b32-l4096 reads ~30 us after shadow ran in the process and ~28.5 without:
measure() of the same session after (a) nothing, (b) a 41 GiB buffer written and freed (cached),
(c) the cache emptied, (d) a 41 GiB buffer allocated, not written, freed; HBM and GPU temperature
from nvidia-smi beside each."""
import sys, json, statistics, subprocess
import torch
sys.path.insert(0, ".")
from harness.cases import Case
from harness.presets import get_preset, get_scale
from harness.scenario import load_scenario
from harness.prepared import PreparedCase
from harness import measure
res = []
def temps():
    out = subprocess.run(["nvidia-smi", "--query-gpu=temperature.gpu,temperature.memory,clocks.sm,clocks.mem,power.draw",
                          "--format=csv,noheader", "-i", "0"], capture_output=True, text=True).stdout.strip()
    return out
case = Case(get_preset("glm5-tp8"), get_scale("prod"), load_scenario("b32-l4096"))
prep = PreparedCase(case, torch.device("cuda"), "flashinfer").build()
GiB = 1 << 30
with prep.session("fused_fp8") as s:
    def rec(label):
        before = temps()
        m = measure.measure(s, 20)
        v = m.metrics["attn_us"].values
        row = dict(label=label, attn_us_median=round(statistics.median(v), 2), attn_us_min=round(min(v), 2),
                   step_device_ms=round(statistics.median(m.metrics["step_device_ms"].values), 4),
                   before=before, after=temps(), reserved_gib=round(torch.cuda.memory_reserved() / GiB, 1))
        res.append(row); print(json.dumps(row), flush=True)
    rec("fresh")
    rec("fresh again")
    x = torch.empty(41 * GiB, dtype=torch.uint8, device="cuda"); x.fill_(1); torch.cuda.synchronize(); del x
    rec("after 41 GiB written and freed (cached)")
    rec("again")
    torch.cuda.empty_cache()
    rec("after empty_cache")
    x = torch.empty(41 * GiB, dtype=torch.uint8, device="cuda"); del x
    rec("after 41 GiB allocated, not written, freed (cached)")
    torch.cuda.empty_cache()
    for k in range(3):
        x = torch.empty(41 * GiB, dtype=torch.uint8, device="cuda"); x.fill_(k); torch.cuda.synchronize(); del x
    torch.cuda.empty_cache()
    rec("after 3x 41 GiB written, cache emptied")
json.dump(res, open(sys.argv[1], "w"), indent=1)
