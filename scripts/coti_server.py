"""coti_server.py — a `coti serve` on a free loopback port for the check scripts beside it
(reuse-check.py, serve-identity.py): `with serving(COTI, [options]) as base:` gives its URL and
stops it afterwards. Standard library only."""
import contextlib
import re
import subprocess


@contextlib.contextmanager
def serving(coti, args):
    srv = subprocess.Popen([coti, 'serve', '--port', '0', *args], stderr=subprocess.PIPE, text=True)
    try:
        port = None
        for line in srv.stderr:
            m = re.search(r'listening on http://127\.0\.0\.1:(\d+)', line)
            if m:
                port = m.group(1)
                break
        if not port:
            raise RuntimeError('the server did not start')
        yield f'http://127.0.0.1:{port}'
    finally:
        srv.terminate()
        srv.wait(timeout=30)
