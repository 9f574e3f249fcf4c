#!/usr/bin/env python3
"""Compare two `coti logits --json`-shaped files (any engine can write that shape):
per position, top-1 agreement, max |Δ logprob| over tokens present in both top lists, and
whether a top-1 disagreement is a near-tie (the two candidates within --tie of each other).
Exit 1 when a real (non-near-tie) top-1 disagreement exists. Standard library only."""
import json
import sys
import argparse


def load(path):
    with open(path) as f:
        return json.load(f)["rows"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--tie", type=float, default=0.05, help="logprob gap under which a flip is a near-tie")
    args = ap.parse_args()
    ra, rb = load(args.a), load(args.b)
    if len(ra) != len(rb):
        sys.exit(f"row count differs: {len(ra)} vs {len(rb)}")
    worst, agree, real = 0.0, 0, 0
    per_pos = []
    for x, y in zip(ra, rb):
        if x["token"] != y["token"]:
            sys.exit(f"token differs at pos {x['pos']}")
        da = {t: lp for t, lp in x["top"]}
        db = {t: lp for t, lp in y["top"]}
        common = set(da) & set(db)
        d = max((abs(da[t] - db[t]) for t in common), default=0.0)
        per_pos.append(d)
        worst = max(worst, d)
        ta, tb = x["top"][0][0], y["top"][0][0]
        if ta == tb:
            agree += 1
        else:
            gap_a = da[ta] - da.get(tb, -1e9)
            gap_b = db[tb] - db.get(ta, -1e9)
            near = min(abs(gap_a), abs(gap_b)) < args.tie
            real += 0 if near else 1
            print(f"pos {x['pos']}: top-1 {ta} vs {tb} (gaps {gap_a:.4f} / {gap_b:.4f}){' near-tie' if near else ' REAL'}")
    n = len(ra)
    print(f"positions {n}  top-1 agreement {agree}/{n}  max|dlogprob| {worst:.5f}  "
          f"median {sorted(per_pos)[n // 2]:.5f}  real disagreements {real}")
    sys.exit(1 if real else 0)


if __name__ == "__main__":
    main()
