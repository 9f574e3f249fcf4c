// readme.test.mjs — the examples of README.md and docs/server.md, run as written so they cannot
// rot: every fenced block whose info string has the word `readme-test` (```bash readme-test,
// ```js readme-test) is taken verbatim from the file and run against a server this test starts,
// with two substitutions only: the examples' address localhost:8080 becomes the test server's,
// and ./coti the binary under test (COTI_BIN). A block passes when it exits 0 and its stdout
// holds the text of its `expect:TEXT` word. bash blocks run with -e -o pipefail, js blocks as
// ES modules inside the repository (so `import OpenAI from 'openai'` resolves).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { promisify } from 'node:util';
import { COTI, startServer } from './helpers.mjs';

const run = promisify(execFile);
const FILES = ['README.md', 'docs/server.md'];

// The marked blocks of a Markdown file: {file, line, lang, expect, code}.
export function markedBlocks(file, text) {
  const blocks = [];
  const lines = text.split('\n');
  for (let i = 0; i < lines.length; i++) {
    const open = /^```(\S+)\s+(.*)$/.exec(lines[i]);
    if (!open || !open[2].split(/\s+/).includes('readme-test')) continue;
    const expect = open[2].split(/\s+/).find((w) => w.startsWith('expect:'));
    const start = i + 1;
    let end = start;
    while (end < lines.length && lines[end] !== '```') end++;
    assert.ok(end < lines.length, `${file}:${i + 1}: unclosed block`);
    blocks.push({ file, line: i + 1, lang: open[1], expect: expect?.slice('expect:'.length), code: lines.slice(start, end).join('\n') + '\n' });
    i = end;
  }
  return blocks;
}

const blocks = FILES.flatMap((f) => markedBlocks(f, readFileSync(f, 'utf8')));

test('the docs have examples marked for this test, of both kinds', () => {
  for (const f of FILES) assert.ok(blocks.some((b) => b.file === f), `no readme-test block in ${f}`);
  assert.ok(blocks.some((b) => b.lang === 'js') && blocks.some((b) => b.lang === 'bash'));
  assert.ok(blocks.every((b) => b.lang === 'js' || b.lang === 'bash'), 'a block of another language would not run');
});

test('markedBlocks takes a block verbatim, with its expectation', () => {
  const md = 'text\n```bash readme-test expect:ok\necho "ok"\n  indented $x\n```\n```bash\nnot marked\n```\n';
  assert.deepEqual(markedBlocks('x.md', md), [
    { file: 'x.md', line: 2, lang: 'bash', expect: 'ok', code: 'echo "ok"\n  indented $x\n' },
  ]);
});

let server;
let scratch;
before(async () => {
  // drafts forced on (--spec-n-min 1): this is about speculation's results, and the depth policy
  // pauses a drafter whose drafts do not pay on a busy machine
  server = await startServer(['--spec', 'mtp', '--spec-n-min', '1', '-np', '2', '-c', '1024']);
  scratch = mkdtempSync(join(resolve('.'), '.readme-test-'));
});
after(async () => {
  if (scratch) rmSync(scratch, { recursive: true, force: true });
  if (server) assert.equal((await server.stop()).code, 0);
});

for (const [k, b] of blocks.entries()) {
  test(`${b.file}:${b.line} (${b.lang}) runs as written`, async () => {
    const code = b.code.replaceAll('localhost:8080', `127.0.0.1:${server.port}`).replaceAll('./coti ', `${COTI} `);
    let out;
    try {
      if (b.lang === 'bash') {
        out = await run('bash', ['-e', '-o', 'pipefail', '-c', code], { timeout: 120000, maxBuffer: 1 << 24 });
      } else {
        const file = join(scratch, `example-${k}.mjs`);
        writeFileSync(file, code);
        out = await run(process.execPath, [file], { timeout: 120000, maxBuffer: 1 << 24 });
      }
    } catch (e) {
      assert.fail(`${b.file}:${b.line} failed (exit ${e.code}):\n${e.stdout}\n${e.stderr}\n--- the block ---\n${code}`);
    }
    assert.ok(out.stdout.length > 0, 'the example printed nothing');
    if (b.expect) assert.ok(out.stdout.includes(b.expect), `stdout lacks '${b.expect}':\n${out.stdout}`);
  });
}
