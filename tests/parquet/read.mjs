// Dump a Parquet file as JSON lines (one object per row, file order), for comparison with the C reader.
//
//   node tests/parquet/read.mjs FILE.parquet [--reader wasm|hyparquet]   dump rows (default: wasm)
//   node tests/parquet/read.mjs FILE.parquet --check                     both readers must agree (exit 1 if not)
//   node tests/parquet/read.mjs FILE.parquet --meta                      row groups / column chunks / pages as JSON
//
// wasm:      parquet-wasm (arrow-rs) -> Arrow IPC -> apache-arrow Table, converted using the Arrow types.
// hyparquet: hyparquet + hyparquet-compressors, an independent pure-JS reader.
// Both print the convention described in common.mjs: int64 as a number when safe else a digit string,
// float32 as the double it holds, NaN/±Infinity as strings, structs in schema field order, maps as objects.

import { readFileSync, realpathSync } from 'node:fs';
import { pathToFileURL } from 'node:url';
import * as arrow from 'apache-arrow';
import * as pw from 'parquet-wasm';
import { parquetMetadata, parquetReadObjects, readOffsetIndex } from 'hyparquet';
import { compressors } from 'hyparquet-compressors';
import { canonGeneric, canonScalar, die } from './common.mjs';

const { DataType } = arrow;

/** Convert one apache-arrow value of the given type to the canonical JSON value. */
function fromArrow(v, type) {
  if (v === null || v === undefined) return null;
  if (DataType.isDictionary(type)) return fromArrow(v, type.dictionary);
  if (DataType.isStruct(type)) {
    const o = {};
    for (const f of type.children) o[f.name] = fromArrow(v[f.name], f.type);
    return o;
  }
  if (DataType.isList(type) || DataType.isFixedSizeList(type)) {
    const t = type.children[0].type;
    const out = new Array(v.length);
    for (let i = 0; i < v.length; i++) out[i] = fromArrow(v.get(i), t);
    return out;
  }
  if (DataType.isMap(type)) {
    const [kf, vf] = type.children[0].type.children;
    const o = {};
    for (const [k, x] of v) o[String(fromArrow(k, kf.type))] = fromArrow(x, vf.type);
    return o;
  }
  return canonScalar(v);
}

const toBytes = (x) => (typeof x === 'string' ? readFileSync(x) : x);
const toArrayBuffer = (b) => b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength);

/** Read with parquet-wasm; returns canonical row objects. */
export function readWasm(file) {
  let ipc;
  try {
    ipc = pw.readParquet(toBytes(file)).intoIPCStream();
  } catch (e) {
    if (e instanceof WebAssembly.RuntimeError) throw new Error(`parquet-wasm panicked (${e.message})`);
    throw e;
  }
  const table = arrow.tableFromIPC(ipc);
  const fields = table.schema.fields;
  const rows = [];
  for (const batch of table.batches) {
    const cols = fields.map((f, i) => batch.getChildAt(i));
    for (let r = 0; r < batch.numRows; r++) {
      const o = {};
      fields.forEach((f, i) => { o[f.name] = fromArrow(cols[i].get(r), f.type); });
      rows.push(o);
    }
  }
  return rows;
}

/** Read with hyparquet; returns canonical row objects. */
export async function readHyparquet(file) {
  const rows = await parquetReadObjects({ file: toArrayBuffer(toBytes(file)), compressors });
  return rows.map(canonGeneric);
}

/** File layout summary from the footer and offset indexes (pages counted when an offset index exists). */
export function fileSummary(file) {
  const bytes = toBytes(file);
  const ab = toArrayBuffer(bytes);
  const md = parquetMetadata(ab);
  const rowGroups = md.row_groups.map((rg) => ({
    num_rows: Number(rg.num_rows),
    columns: rg.columns.map((c) => {
      const m = c.meta_data;
      let pages = null;
      if (c.offset_index_offset !== undefined) {
        const off = Number(c.offset_index_offset);
        const view = new DataView(ab, off, c.offset_index_length);
        pages = readOffsetIndex({ view, offset: 0 }).page_locations.length;
      }
      return {
        path: m.path_in_schema.join('.'),
        codec: m.codec,
        encodings: m.encodings,
        dictionary: m.dictionary_page_offset !== undefined,
        data_pages: pages,
        encoding_stats: m.encoding_stats?.map((s) => `${s.page_type}:${s.encoding}:${s.count}`),
      };
    }),
  }));
  return { num_rows: Number(md.num_rows), version: md.version, created_by: md.created_by, row_groups: rowGroups };
}

/** Compare two canonical row lists; returns null if equal, else a description of the first difference. */
export function diffRows(a, b, nameA = 'a', nameB = 'b') {
  if (a.length !== b.length) return `row counts differ: ${nameA}=${a.length} ${nameB}=${b.length}`;
  for (let i = 0; i < a.length; i++) {
    const sa = JSON.stringify(a[i]);
    const sb = JSON.stringify(b[i]);
    if (sa !== sb) {
      let k = 0;
      while (k < sa.length && sa[k] === sb[k]) k++;
      const at = Math.max(0, k - 60);
      return `row ${i} differs at char ${k}:\n  ${nameA}: ...${sa.slice(at, k + 100)}\n  ${nameB}: ...${sb.slice(at, k + 100)}`;
    }
  }
  return null;
}

async function main() {
  const args = process.argv.slice(2);
  let reader = 'wasm';
  let mode = 'dump';
  const positional = [];
  for (let i = 0; i < args.length; i++) {
    if (args[i] === '--reader') reader = args[++i];
    else if (args[i] === '--check') mode = 'check';
    else if (args[i] === '--meta') mode = 'meta';
    else if (args[i].startsWith('--')) die(`unknown option ${args[i]}`);
    else positional.push(args[i]);
  }
  if (positional.length !== 1) die('usage: node read.mjs FILE.parquet [--reader wasm|hyparquet | --check | --meta]');
  const bytes = readFileSync(positional[0]);
  if (mode === 'meta') {
    process.stdout.write(`${JSON.stringify(fileSummary(bytes), null, 1)}\n`);
    return;
  }
  if (mode === 'check') {
    const a = readWasm(bytes);
    const b = await readHyparquet(bytes);
    const d = diffRows(a, b, 'wasm', 'hyparquet');
    if (d) {
      process.stderr.write(`MISMATCH ${positional[0]}: ${d}\n`);
      process.exit(1);
    }
    process.stdout.write(`ok ${positional[0]}: ${a.length} rows, wasm == hyparquet\n`);
    return;
  }
  let rows;
  if (reader === 'wasm') rows = readWasm(bytes);
  else if (reader === 'hyparquet') rows = await readHyparquet(bytes);
  else die(`--reader must be wasm or hyparquet, got ${reader}`);
  process.stdout.write(rows.map((r) => `${JSON.stringify(r)}\n`).join(''));
}

if (process.argv[1] && import.meta.url === pathToFileURL(realpathSync(process.argv[1])).href) {
  main().catch((e) => die(e.message));
}
