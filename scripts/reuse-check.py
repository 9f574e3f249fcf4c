#!/usr/bin/env python3
"""reuse-check.py COTI [serve options...] — prefix reuse through a running `coti serve`: four
chat requests sharing a ~1000-token system prompt (the second to fourth must take it, not
prefill it), the same requests without the cache (same answers), and an identical request
(one prompt token runs). Prints one line; exit 1 on a failed check. Standard library only: it
runs where node does not (scripts/gpu-check.sh on the device)."""
import json, sys, urllib.request
from concurrent.futures import ThreadPoolExecutor

from coti_server import serving


def post(base, path, body):
    req = urllib.request.Request(base + path, json.dumps(body).encode(), {'Content-Type': 'application/json'})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def main():
    try:
        with serving(sys.argv[1], ['-np', '4', '-c', '2048', *sys.argv[2:]]) as base:
            lines, i = [], 0
            while len('\n'.join(lines)) < 3600:
                lines.append(f'int f{i}(int x) {{ return x * {i} + {i % 7}; }}'); i += 1
            system = 'You are a C assistant. Here is the code base:\n' + '\n'.join(lines)
            qs = ['What does f3 return?', 'Write f2 in Rust.', 'Is f5 pure?', 'Explain f1 briefly.']
            body = lambda q, **kw: {'messages': [{'role': 'system', 'content': system}, {'role': 'user', 'content': q}],
                                    'max_tokens': 8, 'temperature': 0, **kw}
            head = post(base, '/apply-template', {'messages': [{'role': 'system', 'content': system}], 'add_generation_prompt': False})
            n_head = len(post(base, '/tokenize', {'content': head['prompt'], 'parse_special': True})['tokens'])
            first = post(base, '/v1/chat/completions', body(qs[0]))
            with ThreadPoolExecutor(3) as ex:
                rest = list(ex.map(lambda q: post(base, '/v1/chat/completions', body(q)), qs[1:]))
            took = [r['timings']['cache_n'] for r in rest]
            cold = [post(base, '/v1/chat/completions', body(q, cache_prompt=False)) for q in qs]
            same = all(a['choices'][0]['message']['content'] == b['choices'][0]['message']['content'] for a, b in zip([first] + rest, cold))
            again = post(base, '/v1/chat/completions', body(qs[0]))
            ok = first['timings']['cache_n'] == 0 and all(t == n_head for t in took) and same and again['timings']['prompt_n'] == 1 \
                and again['choices'][0]['message']['content'] == first['choices'][0]['message']['content']
            print(f'reuse: system prompt {n_head} tokens, taken by requests 2-4: {took}, answers as cold: {same}, '
                  f'identical request prefilled {again["timings"]["prompt_n"]} token(s): {"ok" if ok else "FAILED"}')
            return 0 if ok else 1
    except RuntimeError as e:
        print(f'reuse: {e}')
        return 1


if __name__ == '__main__':
    sys.exit(main())
