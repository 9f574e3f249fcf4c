#!/usr/bin/env python3
"""pdl-check.py — find kernels that read global memory before their programmatic-launch wait.

Every kernel is launched with programmatic dependent launch (src/cuda/cuda_internal.cuh): it
may start while the kernel before it still runs, so it must not read what earlier kernels write
before griddepcontrol.wait (SASS: ACQBULK). ptxas keeps ordinary loads behind the wait but may
hoist non-coherent ones (LDG.E.CONSTANT, from `const T *__restrict__` parameters) above it: the
bug that gave gemma4 wrong prompt logits on CUDA (docs/notes/2026-12-04-pdl.md). This reads the
SASS of a CUDA build and lists, per kernel, the global loads placed before its first ACQBULK.

  scripts/pdl-check.py FILE...      (a binary or objects; needs cuobjdump, on the device machine)

Kernels allowed to load early (weights only, which nothing writes) are named in ALLOWED.
Exit status 1 if any other kernel loads before its wait, or has no wait at all.
"""
import os
import re
import shutil
import subprocess
import sys

# The matvec, direct matvec and tile kernels fetch weight bytes before the wait on purpose.
ALLOWED = re.compile(r"^(void )?(matvec_kernel|matvec_q8_0_direct_kernel|mmq_kernel|mmf_kernel)\b")
LOAD = re.compile(r"^(?:@!?U?P\w+\s+)?(LDG\S*|LD\.E\S*|LDGSTS\S*|UBLKCP\S*|UTMALDG\S*)\s")
INSN = re.compile(r"/\*([0-9a-f]+)\*/\s+(.*?)\s*;")


def cuobjdump():
    for p in (shutil.which("cuobjdump"), "/usr/local/cuda/bin/cuobjdump"):
        if p and os.access(p, os.X_OK):
            return p
    sys.exit("pdl-check: no cuobjdump (it comes with the CUDA toolkit of the device machine)")


def demangle(names):
    filt = shutil.which("c++filt") or shutil.which("cu++filt") or "/usr/local/cuda/bin/cu++filt"
    try:
        out = subprocess.run([filt], input="\n".join(names), capture_output=True, text=True, check=True).stdout
        return out.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return names


def functions(sass):
    """(mangled name, [(offset, instruction)]) for each function of the dump."""
    name, insns = None, []
    for line in sass.splitlines():
        if "Function :" in line:
            if name:
                yield name, insns
            name, insns = line.split("Function :", 1)[1].strip(), []
            continue
        m = INSN.search(line)
        if m and name:
            insns.append((int(m.group(1), 16), m.group(2)))
    if name:
        yield name, insns


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    tool = cuobjdump()
    found = {}
    for f in sys.argv[1:]:
        sass = subprocess.run([tool, "-sass", f], capture_output=True, text=True, check=True).stdout
        for name, insns in functions(sass):
            waits = [off for off, ins in insns if ins.startswith("ACQBULK")]
            wait = waits[0] if waits else None
            early = [ins for off, ins in insns if LOAD.match(ins) and (wait is None or off < wait)]
            found[name] = (wait, early)
    names = sorted(found)
    bad = 0
    for name, pretty in zip(names, demangle(names)):
        wait, early = found[name]
        if wait is None and not early:
            continue  # reads no global memory (or a host stub)
        if ALLOWED.match(pretty):
            continue
        if wait is None:
            print(f"NO WAIT  {pretty[:160]}")
            bad += 1
        elif early:
            ops = sorted(set(re.sub(r"^@\S+\s+", "", e).split()[0] for e in early))
            print(f"EARLY    {pretty[:160]}: {len(early)} loads before the wait ({', '.join(ops)})")
            bad += 1
    print(f"pdl-check: {len(found)} kernels, {bad} read before their wait")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
