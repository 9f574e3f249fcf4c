#!/usr/bin/env python3
"""serve-identity.py COTI [serve options...] — greedy answers of 16 concurrent requests to
`coti serve -np 16` equal the same requests sent one at a time (issue 24's identity rule; the
concurrent ones arrive together, so their prompts are prefilled together and they decode in
batched cycles). For machines without node, where tests/server/batch.test.mjs cannot run (the
GPU machine). Request i takes prompt i of bench/prompts-code.json, greedy, 48 tokens, ignore_eos,
cache_prompt false, speculation off / mtp / ngram in turn. Prints one line; exit 1 on any
difference or failed request. Standard library only."""
import json
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from coti_server import serving

N = 16
SPECS = ['off', 'mtp', 'ngram']


def complete(base, prompt, spec):
    body = {'prompt': prompt, 'max_tokens': 48, 'temperature': 0, 'ignore_eos': True, 'cache_prompt': False,
            'speculative': {'type': spec}}
    req = urllib.request.Request(base + '/v1/completions', json.dumps(body).encode(), {'Content-Type': 'application/json'})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)['choices'][0]['text']


def main():
    prompts = json.load(open('bench/prompts-code.json'))
    jobs = [(prompts[i % len(prompts)], SPECS[i % len(SPECS)]) for i in range(N)]
    try:
        with serving(sys.argv[1], ['-np', str(N), '-c', str(N * 1024), *sys.argv[2:]]) as base:
            alone = [complete(base, p, s) for p, s in jobs]
            with ThreadPoolExecutor(N) as ex:
                together = list(ex.map(lambda j: complete(base, *j), jobs))
    except (RuntimeError, OSError) as e:
        print(f'identity: {e}')
        return 1
    bad = [i for i in range(N) if alone[i] != together[i]]
    for i in bad:
        print(f'request {i} ({jobs[i][1]}): alone {alone[i]!r}, together {together[i]!r}', file=sys.stderr)
    print(f'identity: {N} concurrent requests, {N - len(bad)} as alone: {"ok" if not bad else "FAILED"}')
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
