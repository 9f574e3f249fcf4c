#!/usr/bin/env python3
"""Per-SM and per-block lateness of the big matvecs in a traced decode (session 12; run on the device:
  persm.py TRACE_FILE, from the repo root; a COTI_TRACE file of `make cuda-trace` build).
For each matvec launch (grid >= 256, block 512) of the last steps: each block's end - launch release.
Question: are the tails the same SMs every time (systematic) or random?"""
import struct, sys, statistics as st
data = open(sys.argv[1], 'rb').read()
recs = [struct.unpack_from('<8Q', data, 64 * i) for i in range(len(data) // 64)]
recs = [r for r in recs if r[1]]
recs.sort(key=lambda r: r[1])
L, i = [], 0
while i < len(recs):
    g = recs[i][4] >> 32
    L.append(recs[i:i + g]); i += g
sig = [(s[0][4], s[0][5] & 0xffffffff) for s in L]
# period of the step
P = None
for p in range(100, 400):
    if all(sig[-3*p+j] == sig[-2*p+j] for j in range(2*p)):
        P = p; break
print('launches', len(L), 'period', P)
nsteps = min(12, len(L)//P - 1)
base = len(L) - 1 - nsteps*P
def key(s): return (s[0][4] >> 32, s[0][4] & 0xffffffff, s[0][5] & 0xffffffff)
classes = {}
for j in range(P):
    s0 = L[base + j]
    g, b, sm = key(s0)
    if b != 512 or g < 256 or not s0[0][3]: continue
    classes.setdefault((g, sm), []).append(j)
print('matvec classes (grid, smem): positions per step')


def class_launches(js):
    """each launch of a class's step positions over the last steps: (step, its records, release,
    the blocks' end - release in us, their median)"""
    for s in range(nsteps):
        for j in js:
            seg = L[base + s*P + j]
            rel = min(r[1] for r in seg)
            ends = [(r[3]-rel)/1e3 for r in seg if r[3]]
            yield s, seg, rel, ends, st.median(ends)


per_class_sm = {}
for (g, sm), js in sorted(classes.items()):
    lat = {}   # smid -> list of (end - release) us, over blocks / steps
    half = [{}, {}]
    blk = {}
    spread = []
    for s, seg, rel, ends, med in class_launches(js):
        spread.append((max(ends) - med))
        for r in seg:
            if not r[3]: continue
            sm_id = r[5] >> 32
            d = (r[3]-rel)/1e3 - med
            lat.setdefault(sm_id, []).append(d)
            half[s % 2].setdefault(sm_id, []).append(d)
            blk.setdefault(r[6], []).append(d)
    m = {k: st.mean(v) for k, v in lat.items()}
    h0 = {k: st.mean(v) for k, v in half[0].items()}; h1 = {k: st.mean(v) for k, v in half[1].items()}
    ks = sorted(set(h0) & set(h1))
    a = [h0[k] for k in ks]; b = [h1[k] for k in ks]
    corr = st.correlation(a, b) if len(ks) > 2 else float('nan')
    bm = {k: st.mean(v) for k, v in blk.items()}
    bk = sorted(bm)
    lo = st.mean(bm[k] for k in bk[:len(bk)//2]); hi = st.mean(bm[k] for k in bk[len(bk)//2:])
    vs = sorted(m.values())
    print(f"grid {g} smem {sm}: {len(js)} per step; tail(max-med) median {st.median(spread):.2f} us; "
          f"per-SM mean lateness p10 {vs[len(vs)//10]:.2f} p50 {vs[len(vs)//2]:.2f} p90 {vs[9*len(vs)//10]:.2f} max {vs[-1]:.2f}; "
          f"split-half corr {corr:.2f}; blocks lo/hi half {lo:.2f}/{hi:.2f}")
    per_class_sm[(g, sm)] = m
    worst = sorted(m, key=lambda k: -m[k])[:10]
    print('   slowest SMs', worst)
cl = list(per_class_sm)
for x in range(len(cl)):
    for y in range(x+1, len(cl)):
        ks = sorted(set(per_class_sm[cl[x]]) & set(per_class_sm[cl[y]]))
        if len(ks) > 2:
            print('corr', cl[x], cl[y], f"{st.correlation([per_class_sm[cl[x]][k] for k in ks], [per_class_sm[cl[y]][k] for k in ks]):.2f}")
# lateness by block-id bin (16 bins), per class: start-rel, mid-rel, end-med
print('by block id (16 bins): start - release | prologue end - release | end - median end  (us)')
for (g, sm), js in sorted(classes.items()):
    bins = [[[], [], []] for _ in range(16)]
    for s, seg, rel, ends, med in class_launches(js):
        for r in seg:
            bi = r[6] * 16 // g
            bins[bi][0].append((r[0]-rel)/1e3)
            if r[2]: bins[bi][1].append((r[2]-rel)/1e3)
            if r[3]: bins[bi][2].append((r[3]-rel)/1e3 - med)
    f = lambda v: f"{st.mean(v):6.2f}" if v else "     -"
    print(f"grid {g} smem {sm}:")
    print('  start ', ' '.join(f(b[0]) for b in bins))
    print('  mid   ', ' '.join(f(b[1]) for b in bins))
    print('  end   ', ' '.join(f(b[2]) for b in bins))
