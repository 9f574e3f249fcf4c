#!/usr/bin/env python3
"""assistant-window.py — copy a gemma4-assistant GGUF with its sliding window set to W, so that it
fits a target made with a narrower window (mkmodel --window W): the tests' way to pair the shipped
assistant with a random E2B-shaped target whose sliding layers hold rings.

  scripts/assistant-window.py IN.gguf OUT.gguf W
"""
import struct
import sys


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    src, dst, window = sys.argv[1], sys.argv[2], int(sys.argv[3])
    b = bytearray(open(src, 'rb').read())
    key = b'gemma4-assistant.attention.sliding_window'
    i = b.index(struct.pack('<Q', len(key)) + key) + 8 + len(key)
    if struct.unpack_from('<I', b, i)[0] != 4:  # GGUF value type u32
        sys.exit(f'{src}: {key.decode()} is not a u32')
    struct.pack_into('<I', b, i + 4, window)
    open(dst, 'wb').write(b)


if __name__ == '__main__':
    main()
