import json, sys, glob, os
d = sys.argv[1]
rows = {}
for side in ("before", "after"):
    for f in sorted(glob.glob(f"{d}/{side}_*.json")):
        for r in json.load(open(f))["results"]:
            rows.setdefault(r["case"], {}).setdefault(side, []).append((r["attnkit_us"], r["torch_us"], r["attnkit_us"] / r["torch_us"], r.get("nn_mha_us")))
print(f"{'case':42s} {'before ratio':>14s} {'after ratio':>14s}   before us        after us")
for case, sides in rows.items():
    def rng(side, i, fmt):
        vals = [x[i] for x in sides.get(side, [])]
        return f"{min(vals):{fmt}}-{max(vals):{fmt}}" if vals else "-"
    print(f"{case:42s} {rng('before',2,'.2f'):>14s} {rng('after',2,'.2f'):>14s}   {rng('before',0,'.1f'):>12s}  {rng('after',0,'.1f'):>12s}")
