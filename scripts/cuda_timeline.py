#!/usr/bin/env python3
"""cuda_timeline.py — read a `make cuda-trace` timeline (COTI_TRACE=file) and say where a decode
step's time goes: per kernel launch, and the gaps where the device waited for the host.

  scripts/cuda_timeline.py FILE [--steps N] [--csv OUT] [--order N] [--shapes]

Blocks are grouped into launches by the time their wait returned ("release"): every block of a
launch is released before any block of the next one (each waits for the one before), so
sorting by release and cutting every grid-size records gives the launches in order. Then:

- host gaps: launches whose first block started more than GAP_US after the previous launch's
  release and was released at once, i.e. nothing of it was queued early: the device waited
  for the host (a graph replay after an upload, a download and sync). A launch whose blocks
  only found room late (the previous kernel's blocks filled the SMs) waits after starting and
  is not counted;
- runs: the launches between two host gaps, grouped by their count and first launch, with the
  device time from the run's first release to the next run's start and the gap before it
  (a decode step is one run; an mtp cycle's draft forwards and verify are runs of their own);
- with --shapes, the longest run's time by launch shape (grid, block, shared memory): where a
  step goes when its launches do not repeat exactly (a MoE step's expert grids vary);
- the repeating step: the shortest period P such that the last 3·P launches repeat with period
  P and hold three host gaps (a decode step; a speculative cycle varies with its accepted count
  and has none), printed
  per position as medians over the last N steps:
    crit      release of this launch to release of the next (its share of the chain)
    lead      how long before its release its first block was resident
    prologue  release to the end of a matvec's input forming (0: not a matvec / none)
    end_med, end_max  release to the median / last block's end (matvecs only)
"""
import statistics
import struct
import sys

WORDS = 8
GAP_US = 5.0
LATE_NS = 1000  # a launch released within this of its first block's start was not queued early


def launches(path):
    data = open(path, 'rb').read()
    recs = [struct.unpack_from('<8Q', data, 8 * WORDS * i) for i in range(len(data) // (8 * WORDS))]
    recs = [r for r in recs if r[1]]
    recs.sort(key=lambda r: r[1])
    out, i = [], 0
    while i < len(recs):
        grid = recs[i][4] >> 32
        seg = recs[i:i + grid]
        rel = sorted(r[1] for r in seg)
        mids = sorted(r[2] for r in seg if r[2])
        ends = sorted(r[3] for r in seg if r[3])
        out.append(dict(grid=grid, block=recs[i][4] & 0xffffffff, smem=recs[i][5] & 0xffffffff,
                        start=min(r[0] for r in seg), release=rel[0],
                        mid=mids[len(mids) // 2] if mids else 0,
                        end_med=ends[len(ends) // 2] if ends else 0, end_max=ends[-1] if ends else 0,
                        mixed=len(set((r[4], r[5] & 0xffffffff) for r in seg)) > 1))
        i += grid
    return out


def main():
    args = sys.argv[1:]
    if not args:
        print(__doc__)
        return 2
    steps = int(args[args.index('--steps') + 1]) if '--steps' in args else 8
    ks = launches(args[0])
    if '--csv' in args:
        with open(args[args.index('--csv') + 1], 'w') as f:
            f.write('grid,block,smem,start,release,mid,end_med,end_max\n')
            for k in ks:
                f.write(f"{k['grid']},{k['block']},{k['smem']},{k['start']},{k['release']},{k['mid']},"
                        f"{k['end_med']},{k['end_max']}\n")
    mixed = sum(k['mixed'] for k in ks)
    print(f"# {len(ks)} launches{f', {mixed} with mixed shapes (grouping failed)' if mixed else ''}")
    if len(ks) < 2:
        return 1
    # launches the device waited for the host to queue: each ends a run of launches
    cuts = [i for i in range(1, len(ks)) if ks[i]['start'] - ks[i - 1]['release'] > GAP_US * 1e3
            and ks[i]['release'] - ks[i]['start'] < LATE_NS]
    gaps = [(ks[i]['start'] - ks[i - 1]['release']) / 1e3 for i in cuts]
    span = (ks[-1]['release'] - ks[0]['release']) / 1e3
    if gaps:
        print(f"# host gaps > {GAP_US:g} us: {len(gaps)}, median {statistics.median(gaps):.1f} us, "
              f"{sum(gaps):.0f} of {span:.0f} us ({100 * sum(gaps) / span:.1f}%)")
    # the runs of launches between host gaps (a graph replay each, or the eager work around it),
    # grouped by length and first launch: for a speculative cycle, its forwards
    runs = {}
    for a, b in zip(cuts, cuts[1:]):
        key = (b - a, f"{ks[a]['grid']}x{ks[a]['block']}")
        runs.setdefault(key, []).append(((ks[b]['start'] - ks[a]['release']) / 1e3,
                                         (ks[a]['start'] - ks[a - 1]['release']) / 1e3))
    if runs:
        print("# runs between host gaps: count, launches, first launch, median device time, median gap before")
        for (n, first), v in sorted(runs.items(), key=lambda kv: -len(kv[1]))[:8]:
            print(f"#   {len(v):5d} x {n:4d} launches from {first:10s} {statistics.median(x[0] for x in v):8.1f} us"
                  f" {statistics.median(x[1] for x in v):8.1f} us")
    if '--order' in args:  # the last N runs in order: a speculative cycle's forwards and what sits between them
        nr = int(args[args.index('--order') + 1])
        print("# runs in order: launches, device us, gap before us, first grids")
        for a, b in list(zip(cuts, cuts[1:]))[-nr:]:
            grids = ' '.join(str(ks[i]['grid']) for i in range(a, min(b, a + 8)))
            print(f"#   {b - a:4d} {(ks[b]['start'] - ks[a]['release']) / 1e3:8.1f} "
                  f"{(ks[a]['start'] - ks[a - 1]['release']) / 1e3:8.1f}   {grids}")
    if '--shapes' in args and len(cuts) > 1:  # the longest run's time by launch shape
        a, b = max(zip(cuts, cuts[1:]), key=lambda ab: ab[1] - ab[0])
        tot = {}
        for i in range(a, b):
            key = (ks[i]['grid'], ks[i]['block'], ks[i]['smem'])
            t = tot.setdefault(key, [0, 0.0, []])
            t[0] += 1
            t[1] += (ks[i + 1]['release'] - ks[i]['release']) / 1e3
            if ks[i]['mid']:
                t[2].append((ks[i]['mid'] - ks[i]['release']) / 1e3)
        span_run = sum(t[1] for t in tot.values())
        print(f"# the longest run ({b - a} launches, {span_run:.1f} us) by launch shape: count, crit us, share, "
              "crit per launch, median prologue")
        for (g, bl, sm), (cnt, us, mids) in sorted(tot.items(), key=lambda kv: -kv[1][1]):
            pro = f"{statistics.median(mids):6.2f}" if mids else "     -"
            print(f"#   {g:6d} x {bl:4d} smem {sm:6d}: {cnt:4d} {us:9.1f} {100 * us / span_run:5.1f}% {us / cnt:7.2f} {pro}")
    sig = [(k['grid'], k['block'], k['smem']) for k in ks]
    # a decode step is one graph replay: it holds a host gap, so a period must span three
    period = next((p for p in range(2, len(sig) // 4 + 1)
                   if sum(i >= len(ks) - 3 * p for i in cuts) >= 3
                   and all(sig[-3 * p + j] == sig[-2 * p + j] for j in range(2 * p))), None)
    if not period:
        print('# no repeating step')
        return 0
    n = min(steps, len(ks) // period - 1)
    last = len(ks) - 1  # the last launch has no successor: steps end just before it
    step_us = [(ks[last - s * period]['release'] - ks[last - (s + 1) * period]['release']) / 1e3 for s in range(n)]
    print(f"# step: {period} launches, {statistics.median(step_us):.1f} us (median of {n})")
    print(f"{'pos':>4} {'grid':>5} {'block':>5} {'smem':>6} {'crit':>7} {'lead':>7} {'prologue':>8} {'end_med':>7} {'end_max':>7}")

    def med(v):
        return statistics.median(v) / 1e3 if v else 0.0
    for j in range(period):
        col = {c: [] for c in ('crit', 'lead', 'mid', 'em', 'ex')}
        for s in range(n):
            b = last - (s + 1) * period + j
            k = ks[b]
            col['crit'].append(ks[b + 1]['release'] - k['release'])
            col['lead'].append(k['release'] - k['start'])
            if k['mid']:
                col['mid'].append(k['mid'] - k['release'])
            if k['end_max']:
                col['em'].append(k['end_med'] - k['release'])
                col['ex'].append(k['end_max'] - k['release'])
        k = ks[last - period + j]
        print(f"{j:4d} {k['grid']:5d} {k['block']:5d} {k['smem']:6d} {med(col['crit']):7.2f} {med(col['lead']):7.2f} "
              f"{med(col['mid']):8.2f} {med(col['em']):7.2f} {med(col['ex']):7.2f}")
    return 0


if __name__ == '__main__':
    sys.exit(main())
