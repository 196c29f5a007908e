// Verify Parquet files against their expected JSON rows with both readers.
//
//   node tests/parquet/verify.mjs DIR                         every entry of DIR/manifest.json (from gen.mjs)
//   node tests/parquet/verify.mjs FILE.parquet EXPECTED.jsonl  one file
//
// For each file: parquet-wasm rows == expected, hyparquet rows == expected (after JSON parsing),
// both readers' dumps identical as text, and the layout expectations recorded by gen.mjs
// (codec, row groups, several data pages, dictionary pages, page v2, encodings) hold.
// Prints one line per file; exit status 1 if anything failed.

import { readFileSync, realpathSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { die, firstDiff, readJsonl } from './common.mjs';
import { diffRows, fileSummary, readHyparquet, readWasm } from './read.mjs';

function compareToExpected(rows, expected, who) {
  if (rows.length !== expected.length) return `${who}: ${rows.length} rows, expected ${expected.length}`;
  for (let i = 0; i < rows.length; i++) {
    const d = firstDiff(rows[i], expected[i], `row[${i}]`);
    if (d) {
      const show = (v) => (v === undefined ? 'missing' : JSON.stringify(v).slice(0, 200));
      return `${who}: ${d.path} differs\n    got:      ${show(d.a)}\n    expected: ${show(d.b)}`;
    }
  }
  return null;
}

/** Check gen.mjs's layout expectations against the footer; returns a list of problems. */
function checkLayout(summary, expect) {
  const problems = [];
  const chunks = summary.row_groups.flatMap((rg) => rg.columns);
  const stats = chunks.flatMap((c) => c.encoding_stats ?? []);
  if (expect.num_rows !== undefined && summary.num_rows !== expect.num_rows) problems.push(`num_rows ${summary.num_rows} != ${expect.num_rows}`);
  if (expect.codec && chunks.some((c) => c.codec !== expect.codec)) problems.push(`codec not ${expect.codec} everywhere`);
  if (expect.min_row_groups && summary.row_groups.length < expect.min_row_groups) problems.push(`only ${summary.row_groups.length} row groups`);
  if (expect.multi_page && !chunks.some((c) => c.data_pages > 1)) problems.push('no column chunk has more than one data page');
  if (expect.dictionary === true && !chunks.some((c) => c.dictionary)) problems.push('no dictionary page');
  if (expect.dictionary === false && chunks.some((c) => c.dictionary)) problems.push('unexpected dictionary page');
  if (expect.page_v2 !== undefined && stats.length) {
    const v2 = stats.some((s) => s.startsWith('DATA_PAGE_V2:'));
    const v1 = stats.some((s) => s.startsWith('DATA_PAGE:'));
    if (expect.page_v2 ? !v2 || v1 : v2) problems.push(`page versions wrong (${expect.page_v2 ? 'want v2 only' : 'want v1 only'})`);
  }
  if (expect.encoding && !chunks.some((c) => c.encodings.includes(expect.encoding))) problems.push(`encoding ${expect.encoding} not used`);
  if (expect.dict_fallback) {
    // A chunk with a dictionary page whose data pages use both RLE_DICTIONARY and a non-dictionary encoding.
    const fb = chunks.some((c) => c.dictionary && (c.encoding_stats ?? []).some((s) => /^DATA_PAGE(_V2)?:RLE_DICTIONARY:/.test(s))
      && (c.encoding_stats ?? []).some((s) => /^DATA_PAGE(_V2)?:(?!RLE_DICTIONARY|PLAIN_DICTIONARY)/.test(s)));
    if (!fb) problems.push('no column chunk falls back from dictionary to plain');
  }
  return problems;
}

/** Verify one file; returns true when everything matches. */
export async function verifyFile(parquetPath, expectedPath, expect = {}) {
  const bytes = readFileSync(parquetPath);
  const expected = readJsonl(expectedPath);
  const problems = [];
  let wasm = null;
  let hyp = null;
  try { wasm = readWasm(bytes); } catch (e) { problems.push(`wasm read failed: ${e.message}`); }
  try { hyp = await readHyparquet(bytes); } catch (e) { problems.push(`hyparquet read failed: ${e.message}`); }
  if (wasm) { const d = compareToExpected(wasm, expected, 'wasm'); if (d) problems.push(d); }
  if (hyp) { const d = compareToExpected(hyp, expected, 'hyparquet'); if (d) problems.push(d); }
  if (wasm && hyp) { const d = diffRows(wasm, hyp, 'wasm', 'hyparquet'); if (d) problems.push(`dumps differ as text: ${d}`); }
  const summary = fileSummary(bytes);
  problems.push(...checkLayout(summary, expect));
  const pages = summary.row_groups.flatMap((rg) => rg.columns).reduce((n, c) => n + (c.data_pages ?? 0), 0);
  const info = `${expected.length} rows, ${summary.row_groups.length} row groups, ${pages} data pages`;
  if (problems.length) {
    process.stdout.write(`FAIL ${parquetPath} (${info})\n${problems.map((p) => `  - ${p}\n`).join('')}`);
    return false;
  }
  process.stdout.write(`ok   ${parquetPath} (${info})\n`);
  return true;
}

/** Verify every file listed in DIR/manifest.json. */
export async function verifyDir(dir) {
  const manifest = JSON.parse(readFileSync(join(dir, 'manifest.json'), 'utf8'));
  let good = 0;
  for (const m of manifest) {
    if (await verifyFile(join(dir, m.file), join(dir, m.expected), m.expect)) good++;
  }
  process.stdout.write(`${good}/${manifest.length} files ok\n`);
  return good === manifest.length;
}

async function main() {
  const args = process.argv.slice(2);
  let ok;
  if (args.length === 1) ok = await verifyDir(args[0]);
  else if (args.length === 2) ok = await verifyFile(args[0], args[1]);
  else die('usage: node verify.mjs DIR | node verify.mjs FILE.parquet EXPECTED.jsonl');
  process.exit(ok ? 0 : 1);
}

if (process.argv[1] && import.meta.url === pathToFileURL(realpathSync(process.argv[1])).href) {
  main().catch((e) => die(e.stack || e.message));
}
