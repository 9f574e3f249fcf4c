# model of mmf_kernel's pipeline: groups, waits, buffer reuse
import itertools
def run(n_kt, KPR, NRAW):
    n_rt = -(-n_kt // KPR)
    groups = []          # list of sets of (kind, idx)
    cur = set()
    landed = set()
    raw_slot = {}        # slot -> tile currently held/in flight
    bs = {}              # buffer -> x tile
    As = {}              # buffer -> decoded K tile
    def issue_raw(rt):
        s = rt % NRAW
        assert raw_slot.get(s, 'free') == 'free', f"raw slot {s} busy with {raw_slot.get(s)} when issuing {rt}"
        raw_slot[s] = rt; cur.add(('raw', rt))
    def issue_x(kt):
        b = kt & 1
        assert bs.get(b, 'free') == 'free', f"Bs{b} busy {bs.get(b)} issuing x{kt}"
        bs[b] = kt; cur.add(('x', kt))
    def commit():
        nonlocal cur
        groups.append(cur); cur = set()
    def wait(n):
        # all but the newest n groups complete
        for g in groups[:len(groups) - n] if n else groups:
            landed.update(g)
    def decode(kt):
        rt = kt // KPR
        assert ('raw', rt) in landed, f"decode {kt} before raw {rt} landed"
        assert raw_slot[rt % NRAW] == rt
        As[kt & 1] = kt
    def mma(kt):
        assert ('x', kt) in landed and bs[kt & 1] == kt, f"mma {kt}: x not landed"
        assert As[kt & 1] == kt, f"mma {kt}: As holds {As.get(kt & 1)}"
    def free_after_step(kt):
        # after barrier B of step kt: Bs[kt&1] free; raw tile finished if its last K tile was kt+1
        bs[kt & 1] = 'free' if kt >= 0 else bs.get(kt & 1, 'free')
        last = kt + 1
        if (last + 1) % KPR == 0 or last + 1 == n_kt:
            rt = last // KPR
            if raw_slot.get(rt % NRAW) == rt: raw_slot[rt % NRAW] = 'free'
    def refill(kt):
        if kt + 2 < n_kt: issue_x(kt + 2)
        if (kt + 2) % KPR == 0 and (kt + 2) // KPR - 1 + NRAW < n_rt: issue_raw((kt + 2) // KPR - 1 + NRAW)
        commit()
    for rt in range(min(NRAW, n_rt)): issue_raw(rt)
    commit()
    issue_x(0); commit()
    wait(0)
    decode(0)
    # barrier; tile 0 decoded; free raw slot if tile 0's last K tile was 0
    if KPR == 1 or n_kt == 1:
        raw_slot[0] = 'free'
    refill(-1)
    for kt in range(n_kt):
        wait(0 if (NRAW == 1 and (kt + 1) % KPR == 0) else 1)
        if kt + 1 < n_kt: decode(kt + 1)
        mma(kt)
        # barrier B
        bs[kt & 1] = 'free'
        if kt + 1 < n_kt:
            last = kt + 1
            if (last + 1) % KPR == 0:
                rt = last // KPR
                raw_slot[rt % NRAW] = 'free'
        refill(kt)
    return True
for KPR, NRAW in [(1, 2), (4, 1), (1, 1)]:
    for n_kt in list(range(1, 20)) + [64, 192]:
        if KPR == 4 and n_kt % 4: continue
        run(n_kt, KPR, NRAW)
print("pipeline model: all buffer and wait checks hold")
