// Generate the Parquet test corpus for the C reader.
//
//   node tests/parquet/gen.mjs OUTDIR [--verify]
//
// Writes into OUTDIR (created if missing):
//   rows.jsonl, schema.json            ~300 synthetic rows covering the supported types and edge cases
//   case_<comp>_v<1|2>_dict<on|off>.parquet
//                                      rows.jsonl in every compression x writer version x dictionary
//                                      combination, 64-row row groups and small data pages
//   enc_<encoding>.parquet             rows.jsonl with one explicit encoding (writer v2, dictionary off)
//   enc_<encoding>_v1.parquet          the same with writer v1 (data page v1)
//   codec_<brotli|lz4|lz4_raw>.parquet the other codecs parquet-wasm can write
//   dict_fallback.parquet              tiny dictionary page limit: dictionary falls back to plain mid-chunk
//   empty.parquet + empty.jsonl        same schema, zero rows
//   map.parquet + map.jsonl + map_schema.json   a map<utf8,int64> column
//   gsm8k.parquet + gsm8k.jsonl + gsm8k_schema.json
//                                      verl's examples/data_preprocess/gsm8k.py layout, 50 made-up questions,
//                                      default writer settings (snappy, dictionary on)
//   manifest.json                      every .parquet with its expected .jsonl, options and layout expectations
// Prints the files written (one per line). With --verify, runs verify.mjs on OUTDIR afterwards.

import { mkdirSync, realpathSync, writeFileSync } from 'node:fs';
import { pathToFileURL } from 'node:url';
import { join } from 'node:path';
import { die, normalizeSchema } from './common.mjs';
import { writeRows } from './write.mjs';
import { verifyDir } from './verify.mjs';

// ---------------------------------------------------------------- deterministic randomness

function mulberry32(seed) {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const rand = mulberry32(20240611);
const randInt = (lo, hi) => lo + Math.floor(rand() * (hi - lo + 1)); // inclusive
const pick = (xs) => xs[randInt(0, xs.length - 1)];

const WORDS = ['alpha', 'beta', 'gamma', 'delta', 'apple', 'river', 'stone', 'cloud', 'seven', 'matrix',
  'token', 'reward', 'policy', 'gradient', 'sample', 'answer', 'question', 'think', 'step', 'final'];
const UNICODE = ['héllo wörld', 'naïve café — “quotes”', '你好，世界', 'こんにちは', 'Привет мир', 'emoji 🌍🚀👍🏽',
  'math ∑∫√π≈', 'mixed: a\u00e9\u4e2d\ud83d\ude00z', 'עברית', 'العربية'];
const words = (n) => Array.from({ length: n }, () => pick(WORDS)).join(' ');

// ---------------------------------------------------------------- main corpus

export const MAIN_SCHEMA = normalizeSchema({
  fields: [
    { name: 'id', type: 'int32', nullable: false },
    { name: 'text', type: 'utf8' },
    { name: 'i32', type: 'int32' },
    { name: 'i64', type: 'int64' },
    { name: 'f32', type: 'float32' },
    { name: 'f64', type: 'float64' },
    { name: 'flag', type: 'bool' },
    { name: 'reward_model', type: { struct: [{ name: 'style', type: 'utf8' }, { name: 'ground_truth', type: 'utf8' }] } },
    {
      name: 'prompt',
      type: { list: { struct: [{ name: 'role', type: 'utf8', nullable: false }, { name: 'content', type: 'utf8' }] } },
    },
    { name: 'tags', type: { list: 'utf8' } },
    { name: 'matrix', type: { list: { list: 'int32', element_nullable: false } } },
    { name: 'meta', type: { struct: [{ name: 'source', type: 'utf8' }, { name: 'scores', type: { list: 'float64' } }] } },
  ],
});

const I32_SPECIAL = [0, -1, 1, 2147483647, -2147483648, 65536, -65537];
const I64_SPECIAL = [0, -1, 2 ** 32, 2 ** 32 + 1, -(2 ** 32), 1234567890123, -(2 ** 40), Number.MAX_SAFE_INTEGER,
  Number.MIN_SAFE_INTEGER, '9007199254740993', '9223372036854775807', '-9223372036854775808'];
const F32_SPECIAL = [0, -1.5, 3.4028234663852886e38, -3.4028234663852886e38, 1.401298464324817e-45,
  1.1754943508222875e-38, Math.fround(0.1), 'NaN', 'Infinity', '-Infinity'];
const F64_SPECIAL = [0, -0.5, 1e300, -1e300, 5e-324, 2.2250738585072014e-308, 0.1, 123456789.123456789,
  -98765.4321, 'NaN', 'Infinity', '-Infinity'];
const STRING_SPECIAL = ['', 'tab\there', 'line1\nline2\r\n', 'quote " backslash \\ slash /', 'ctrl \u0001\u001f',
  'nul \u0000 inside', ' leading and trailing spaces '];

function makeText(i) {
  switch (i % 10) {
    case 0: return '';
    case 1: return null;
    case 2: return `${pick(UNICODE)} #${i}`;
    case 3: return i % 30 === 3 ? `long#${i}: ${words(2200)}` : words(randInt(1, 6)); // ~12-15 KB
    case 4: return STRING_SPECIAL[(i / 10 | 0) % STRING_SPECIAL.length];
    default: return words(randInt(1, 12));
  }
}

function makeRow(i) {
  const text = makeText(i);
  const i32 = i % 7 === 6 ? null : (i < I32_SPECIAL.length * 3 && i % 3 === 0 ? I32_SPECIAL[i / 3] : randInt(-1e9, 1e9));
  let i64;
  if (i % 11 === 10) i64 = null;
  else if (i % 4 === 1 && (i >> 2) < I64_SPECIAL.length) i64 = I64_SPECIAL[i >> 2];
  else i64 = randInt(-1e6, 1e6) * 1000003 + (i % 2 ? 2 ** 33 : 0);
  let f32;
  if (i % 9 === 8) f32 = null;
  else if (i % 5 === 2 && (i / 5 | 0) < F32_SPECIAL.length) f32 = F32_SPECIAL[i / 5 | 0];
  else f32 = Math.fround((rand() - 0.5) * 2000); // stored values are exact float32s
  let f64;
  if (i % 13 === 12) f64 = null;
  else if (i % 5 === 3 && (i / 5 | 0) < F64_SPECIAL.length) f64 = F64_SPECIAL[i / 5 | 0];
  else f64 = (rand() - 0.5) * 10 ** randInt(-5, 12);
  const flag = i % 5 === 4 ? null : rand() < 0.5;
  const reward_model = i % 6 === 5 ? null
    : { style: i % 17 === 0 ? null : pick(['rule', 'rule', 'model']), ground_truth: i % 19 === 0 ? null : String(i * 7 - 100) };
  let prompt;
  if (i % 8 === 0) prompt = null;
  else if (i % 8 === 1) prompt = [];
  else {
    prompt = [];
    if (i % 3 === 0) prompt.push({ role: 'system', content: 'You are a helpful assistant.' });
    prompt.push({ role: 'user', content: i % 10 === 2 ? pick(UNICODE) : `${words(randInt(3, 20))}?` });
    if (i % 4 === 2) prompt.push({ role: 'assistant', content: i % 16 === 2 ? null : words(randInt(0, 8)) });
  }
  let tags = null;
  if (i % 9 !== 0) tags = Array.from({ length: randInt(0, 4) }, () => (rand() < 0.2 ? null : pick(WORDS)));
  let matrix = null;
  if (i % 10 !== 7) {
    matrix = Array.from({ length: randInt(0, 3) }, () => (rand() < 0.15 ? null
      : Array.from({ length: randInt(0, 4) }, () => randInt(-(2 ** 31), 2 ** 31 - 1))));
  }
  let meta = null;
  if (i % 12 !== 11) {
    let scores = null;
    if (i % 5 !== 0) scores = i % 5 === 1 ? [] : Array.from({ length: randInt(1, 3) }, () => (rand() < 0.1 ? null : Math.round(rand() * 1e6) / 1e3));
    meta = { source: i % 7 === 3 ? null : pick(['gsm8k', 'math', 'synthetic']), scores };
  }
  return { id: i, text, i32, i64, f32, f64, flag, reward_model, prompt, tags, matrix, meta };
}

// ---------------------------------------------------------------- GSM8K (verl layout)

const INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".';

// Returns {question, answer} in GSM8K style: steps with <<calc>> annotations, "#### N" last line.
function makeGsm8k(k) {
  const a = randInt(3, 60);
  const b = randInt(2, 25);
  const c = randInt(1, a * b - 1);
  const name = pick(['Natalia', 'Weng', 'Betty', 'Julie', 'James', 'Albert', 'Ken', 'Alexis', 'Tina', 'Randy']);
  const fmt = (n) => n.toLocaleString('en-US'); // GSM8K answers may contain thousands separators
  switch (k % 5) {
    case 0: {
      const total = a * b;
      return {
        question: `${name} bakes ${a} muffins every day for ${b} days and gives away ${c} of them. How many muffins does ${name} have left?`,
        answer: `${name} bakes ${a} * ${b} = <<${a}*${b}=${total}>>${total} muffins.\nAfter giving some away, ${name} has ${total} - ${c} = <<${total}-${c}=${total - c}>>${total - c} muffins left.\n#### ${fmt(total - c)}`,
      };
    }
    case 1: {
      const per = a * 12;
      const total = per * b * 10;
      return {
        question: `A factory packs ${a} dozen bolts into each crate. It ships ${b} crates a day for 10 days. How many bolts does it ship?`,
        answer: `Each crate holds ${a} * 12 = <<${a}*12=${per}>>${per} bolts.\nIn one day it ships ${per} * ${b} = <<${per}*${b}=${per * b}>>${per * b} bolts.\nIn 10 days it ships ${per * b} * 10 = <<${per * b}*10=${total}>>${total} bolts.\n#### ${fmt(total)}`,
      };
    }
    case 2: {
      const price = b * 2;
      const spent = price * a;
      return {
        question: `${name} buys ${a} notebooks at $${price} each and pays with $${spent + c}. How much change does ${name} get?`,
        answer: `The notebooks cost ${a} * ${price} = $<<${a}*${price}=${spent}>>${spent}.\nThe change is ${spent + c} - ${spent} = $<<${spent + c}-${spent}=${c}>>${c}.\n#### ${c}`,
      };
    }
    case 3: {
      const whole = a * 4;
      return {
        question: `A tank holds ${whole} liters. ${name} uses a quarter of it on Monday and ${b} liters on Tuesday. How many liters remain?`,
        answer: `A quarter of the tank is ${whole} / 4 = <<${whole}/4=${a}>>${a} liters.\nAfter Monday there are ${whole} - ${a} = <<${whole}-${a}=${whole - a}>>${whole - a} liters.\nAfter Tuesday there are ${whole - a} - ${b} = <<${whole - a}-${b}=${whole - a - b}>>${whole - a - b} liters.\n#### ${whole - a - b}`,
      };
    }
    default: {
      const minutes = 60 * b; // whole hours keep every step an integer
      return {
        question: `${name} reads ${a} pages per hour. How many pages does ${name} read in ${minutes} minutes?`,
        answer: `${minutes} minutes is ${minutes} / 60 = <<${minutes}/60=${b}>>${b} hours.\nSo ${name} reads ${a} * ${b} = <<${a}*${b}=${a * b}>>${a * b} pages.\n#### ${fmt(a * b)}`,
      };
    }
  }
}

// verl's extract_solution: text after "#### " with commas removed.
function extractSolution(answer) {
  const m = /#### (-?[0-9.,]+)/.exec(answer);
  if (!m) throw new Error(`no #### in ${answer}`);
  return m[1].replace(/,/g, '');
}

export const GSM8K_SCHEMA = normalizeSchema({
  fields: [
    { name: 'data_source', type: 'utf8' },
    { name: 'prompt', type: { list: { struct: [{ name: 'role', type: 'utf8' }, { name: 'content', type: 'utf8' }] } } },
    { name: 'ability', type: 'utf8' },
    { name: 'reward_model', type: { struct: [{ name: 'style', type: 'utf8' }, { name: 'ground_truth', type: 'utf8' }] } },
    {
      name: 'extra_info',
      type: {
        struct: [{ name: 'split', type: 'utf8' }, { name: 'index', type: 'int64' },
          { name: 'answer', type: 'utf8' }, { name: 'question', type: 'utf8' }],
      },
    },
  ],
});

function gsm8kRows(n) {
  return Array.from({ length: n }, (_, idx) => {
    const { question, answer } = makeGsm8k(idx);
    return {
      data_source: 'openai/gsm8k',
      prompt: [{ role: 'user', content: `${question} ${INSTRUCTION}` }],
      ability: 'math',
      reward_model: { style: 'rule', ground_truth: extractSolution(answer) },
      extra_info: { split: 'train', index: idx, answer, question },
    };
  });
}

// ---------------------------------------------------------------- output

const MAP_SCHEMA = normalizeSchema({
  fields: [
    { name: 'id', type: 'int32', nullable: false },
    { name: 'counts', type: { map: { key: 'utf8', value: 'int64' } } },
  ],
});

function mapRows(n) {
  return Array.from({ length: n }, (_, i) => {
    if (i % 7 === 3) return { id: i, counts: null };
    const counts = {};
    for (let k = 0; k < i % 4; k++) counts[`k${k}_${pick(WORDS)}`] = k === 2 ? null : randInt(-1e6, 1e6);
    return { id: i, counts };
  });
}

const toJsonl = (rows) => rows.map((r) => `${JSON.stringify(r)}\n`).join('');

function main() {
  const args = process.argv.slice(2);
  const verify = args.includes('--verify');
  const pos = args.filter((a) => !a.startsWith('--'));
  if (pos.length !== 1 || args.some((a) => a.startsWith('--') && a !== '--verify')) die('usage: node gen.mjs OUTDIR [--verify]');
  const outDir = pos[0];
  mkdirSync(outDir, { recursive: true });
  const t0 = performance.now();
  const written = [];
  const manifest = [];
  const put = (name, data) => { writeFileSync(join(outDir, name), data); written.push(join(outDir, name)); };
  const parquet = (name, rows, schema, expected, opts, expect = {}) => {
    put(name, writeRows(rows, schema, opts));
    manifest.push({ file: name, expected, options: opts, expect });
  };

  const rows = Array.from({ length: 300 }, (_, i) => makeRow(i));
  put('schema.json', `${JSON.stringify(MAIN_SCHEMA, null, 1)}\n`);
  put('rows.jsonl', toJsonl(rows));

  // 64-row row groups and 1 KiB data pages. Dictionary-encoded pages hold only small RLE indices, so
  // dictionary-on files use a 16-byte page limit (checked every 8-row write batch) to get several
  // RLE_DICTIONARY data pages after each dictionary page.
  const small = { rowGroupSize: 64, pageSize: 1024, writeBatchSize: 8 };
  const smallDict = { ...small, pageSize: 16 };
  const CODEC = { uncompressed: 'UNCOMPRESSED', snappy: 'SNAPPY', zstd: 'ZSTD', gzip: 'GZIP', brotli: 'BROTLI', lz4: 'LZ4', lz4_raw: 'LZ4_RAW' };
  for (const compression of ['uncompressed', 'snappy', 'zstd', 'gzip']) {
    for (const v of ['1', '2']) {
      for (const dict of ['on', 'off']) {
        parquet(`case_${compression}_v${v}_dict${dict}.parquet`, rows, MAIN_SCHEMA, 'rows.jsonl',
          { compression, writerVersion: v, dictionary: dict, ...(dict === 'on' ? smallDict : small) },
          { codec: CODEC[compression], min_row_groups: 5, multi_page: true, dictionary: dict === 'on', page_v2: v === '2' });
      }
    }
  }
  const ENC = { plain: 'PLAIN', delta_binary_packed: 'DELTA_BINARY_PACKED', delta_length_byte_array: 'DELTA_LENGTH_BYTE_ARRAY',
    delta_byte_array: 'DELTA_BYTE_ARRAY', byte_stream_split: 'BYTE_STREAM_SPLIT', rle: 'RLE' };
  // Writer v2 with dictionary off already defaults to DELTA_BINARY_PACKED (ints), DELTA_BYTE_ARRAY
  // (strings) and RLE (bools), so the _v1 twins put the same encodings into v1 data pages.
  for (const encoding of Object.keys(ENC)) {
    for (const v of ['2', '1']) {
      parquet(`enc_${encoding}${v === '1' ? '_v1' : ''}.parquet`, rows, MAIN_SCHEMA, 'rows.jsonl',
        { compression: 'snappy', writerVersion: v, dictionary: 'off', encoding, ...small },
        { codec: 'SNAPPY', min_row_groups: 5, multi_page: true, dictionary: false, page_v2: v === '2', encoding: ENC[encoding] });
    }
  }
  for (const compression of ['brotli', 'lz4', 'lz4_raw']) {
    parquet(`codec_${compression}.parquet`, rows, MAIN_SCHEMA, 'rows.jsonl',
      { compression, writerVersion: '2', dictionary: 'on', ...smallDict }, { codec: CODEC[compression], multi_page: true });
  }
  parquet('dict_fallback.parquet', rows, MAIN_SCHEMA, 'rows.jsonl',
    { compression: 'snappy', writerVersion: '1', dictionary: 'on', dictPageSize: 512, pageSize: 1024, rowGroupSize: 150 },
    { codec: 'SNAPPY', dictionary: true, dict_fallback: true });
  put('empty.jsonl', '');
  parquet('empty.parquet', [], MAIN_SCHEMA, 'empty.jsonl', { compression: 'snappy' }, { num_rows: 0 });

  const mrows = mapRows(40);
  put('map_schema.json', `${JSON.stringify(MAP_SCHEMA, null, 1)}\n`);
  put('map.jsonl', toJsonl(mrows));
  parquet('map.parquet', mrows, MAP_SCHEMA, 'map.jsonl', { compression: 'snappy' });

  const grows = gsm8kRows(50);
  put('gsm8k_schema.json', `${JSON.stringify(GSM8K_SCHEMA, null, 1)}\n`);
  put('gsm8k.jsonl', toJsonl(grows));
  parquet('gsm8k.parquet', grows, GSM8K_SCHEMA, 'gsm8k.jsonl', { compression: 'snappy' },
    { codec: 'SNAPPY', dictionary: true });

  put('manifest.json', `${JSON.stringify(manifest, null, 1)}\n`);
  const genMs = performance.now() - t0;
  process.stdout.write(written.map((f) => `${f}\n`).join(''));
  process.stderr.write(`gen: ${written.length} files in ${(genMs / 1000).toFixed(2)} s\n`);
  if (verify) {
    const t1 = performance.now();
    const ok = verifyDir(outDir);
    return ok.then((good) => {
      process.stderr.write(`verify: ${((performance.now() - t1) / 1000).toFixed(2)} s\n`);
      if (!good) process.exit(1);
    });
  }
  return undefined;
}

if (process.argv[1] && import.meta.url === pathToFileURL(realpathSync(process.argv[1])).href) {
  Promise.resolve().then(main).catch((e) => die(e.stack || e.message));
}
