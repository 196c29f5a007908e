// Write JSON rows to Parquet with parquet-wasm (arrow-rs compiled to wasm).
//
//   node tests/parquet/write.mjs ROWS.jsonl OUT.parquet [options]
//
// Options:
//   --schema SCHEMA.json          schema in the JSON form described in common.mjs (else inferred)
//   --compression C               uncompressed|snappy|gzip|zstd|brotli|lz4|lz4_raw (default snappy)
//   --writer-version 1|2          WriterVersion V1/V2: data page v1 vs v2 (default 1)
//   --dictionary on|off           dictionary encoding (default on)
//   --encoding E                  plain|rle|delta_binary_packed|delta_length_byte_array|
//                                 delta_byte_array|byte_stream_split; applied to the leaf columns whose
//                                 type allows it (the fallback encoding when --dictionary is on)
//   --row-group-size N            max rows per row group
//   --row-group-bytes N           max bytes per row group
//   --page-size BYTES             data page size limit (with the dictionary on, a page holds only the
//                                 small RLE indices, so it takes a tiny limit to split pages)
//   --dict-page-size BYTES        dictionary page size limit (dictionary falls back when exceeded)
//   --write-batch-size N          rows per mini batch; page limits are only checked between mini
//                                 batches, so small pages need a small batch size too
//   --statistics none|chunk|page  statistics level (default page: column + offset index)
//   --verbose                     describe what was applied on stderr
// Prints nothing on success; an error message and exit status 2 on failure.

import { readFileSync, realpathSync, writeFileSync } from 'node:fs';
import { pathToFileURL } from 'node:url';
import * as arrow from 'apache-arrow';
import * as pw from 'parquet-wasm';
import { die, inferSchema, leafColumns, normalizeSchema, readJsonl, rowsToArrowTable } from './common.mjs';

export const COMPRESSIONS = {
  uncompressed: pw.Compression.UNCOMPRESSED,
  snappy: pw.Compression.SNAPPY,
  gzip: pw.Compression.GZIP,
  zstd: pw.Compression.ZSTD,
  brotli: pw.Compression.BROTLI,
  lz4: pw.Compression.LZ4, // deprecated Hadoop-framed LZ4
  lz4_raw: pw.Compression.LZ4_RAW,
  // LZO is in the enum but not compiled in: arrow-rs panics on it.
};

// Encoding -> schema leaf types arrow-rs 56 accepts it for (anything else panics inside the wasm).
export const ENCODINGS = {
  plain: { enc: pw.Encoding.PLAIN, types: ['utf8', 'int32', 'int64', 'float32', 'float64', 'bool'] },
  rle: { enc: pw.Encoding.RLE, types: ['bool'] },
  delta_binary_packed: { enc: pw.Encoding.DELTA_BINARY_PACKED, types: ['int32', 'int64'] },
  delta_length_byte_array: { enc: pw.Encoding.DELTA_LENGTH_BYTE_ARRAY, types: ['utf8'] },
  delta_byte_array: { enc: pw.Encoding.DELTA_BYTE_ARRAY, types: ['utf8'] },
  byte_stream_split: { enc: pw.Encoding.BYTE_STREAM_SPLIT, types: ['float32', 'float64', 'int32', 'int64'] },
};

const STATISTICS = { none: pw.EnabledStatistics.None, chunk: pw.EnabledStatistics.Chunk, page: pw.EnabledStatistics.Page };

const posInt = (name, v) => {
  const n = Number(v);
  if (!Number.isInteger(n) || n <= 0) throw new Error(`${name} needs a positive integer, got ${JSON.stringify(v)}`);
  return n;
};

/** Parse write options from argv-style tokens. Returns {opts, positional}. */
export function parseWriteArgs(argv) {
  const opts = { compression: 'snappy' };
  const positional = [];
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (!a.startsWith('--')) { positional.push(a); continue; }
    const val = () => {
      if (i + 1 >= argv.length) throw new Error(`${a} needs a value`);
      return argv[++i];
    };
    switch (a) {
      case '--schema': opts.schemaPath = val(); break;
      case '--compression': opts.compression = val().toLowerCase(); break;
      case '--writer-version': opts.writerVersion = val(); break;
      case '--dictionary': opts.dictionary = val(); break;
      case '--encoding': opts.encoding = val().toLowerCase(); break;
      case '--row-group-size': opts.rowGroupSize = posInt(a, val()); break;
      case '--row-group-bytes': opts.rowGroupBytes = posInt(a, val()); break;
      case '--page-size': opts.pageSize = posInt(a, val()); break;
      case '--dict-page-size': opts.dictPageSize = posInt(a, val()); break;
      case '--write-batch-size': opts.writeBatchSize = posInt(a, val()); break;
      case '--statistics': opts.statistics = val().toLowerCase(); break;
      case '--verbose': opts.verbose = true; break;
      case '--page-row-limit':
        throw new Error('--page-row-limit is not available: parquet-wasm 0.8.0 does not expose arrow-rs\'s '
          + 'data_page_row_count_limit. Use --write-batch-size N with a small --page-size instead.');
      default: throw new Error(`unknown option ${a}`);
    }
  }
  return { opts, positional };
}

/** Build parquet-wasm WriterProperties for a schema; returns {props, notes} (notes: human-readable summary). */
export function buildWriterProperties(schema, opts) {
  const notes = [];
  let b = new pw.WriterPropertiesBuilder();
  const comp = COMPRESSIONS[opts.compression];
  if (comp === undefined) throw new Error(`unsupported --compression ${opts.compression} (want ${Object.keys(COMPRESSIONS).join('|')})`);
  b = b.setCompression(comp);
  notes.push(`compression=${opts.compression}`);
  if (opts.writerVersion !== undefined) {
    if (opts.writerVersion !== '1' && opts.writerVersion !== '2') throw new Error('--writer-version must be 1 or 2');
    b = b.setWriterVersion(opts.writerVersion === '2' ? pw.WriterVersion.V2 : pw.WriterVersion.V1);
    notes.push(`writer_version=${opts.writerVersion}`);
  }
  if (opts.dictionary !== undefined) {
    if (opts.dictionary !== 'on' && opts.dictionary !== 'off') throw new Error('--dictionary must be on or off');
    b = b.setDictionaryEnabled(opts.dictionary === 'on');
    notes.push(`dictionary=${opts.dictionary}`);
  }
  if (opts.encoding !== undefined) {
    const e = ENCODINGS[opts.encoding];
    if (!e) {
      const hint = /dict/.test(opts.encoding) ? ' (dictionary encodings are selected with --dictionary on)' : '';
      throw new Error(`unsupported --encoding ${opts.encoding}${hint}; want ${Object.keys(ENCODINGS).join('|')}`);
    }
    // parquet-wasm only addresses columns by a single path segment, so per-column settings reach
    // top-level primitive columns only. If every leaf allows the encoding, set it globally
    // (reaching nested leaves too); otherwise set it on each allowed top-level column.
    const leaves = leafColumns(schema);
    const ok = leaves.filter((l) => e.types.includes(l.type));
    if (ok.length === leaves.length) {
      b = b.setEncoding(e.enc);
      notes.push(`encoding=${opts.encoding} on all ${leaves.length} leaf columns`);
    } else {
      const top = ok.filter((l) => l.topLevel);
      if (top.length === 0) {
        throw new Error(`--encoding ${opts.encoding} applies to ${e.types.join('/')} columns and the schema has no `
          + 'top-level column of those types (nested leaves cannot be addressed one by one)');
      }
      for (const l of top) b = b.setColumnEncoding(l.path[0], e.enc);
      const skipped = leaves.filter((l) => !top.includes(l)).map((l) => l.path.join('.'));
      notes.push(`encoding=${opts.encoding} on ${top.map((l) => l.path[0]).join(',')}; writer default on ${skipped.join(',')}`);
    }
  }
  if (opts.rowGroupSize !== undefined) { b = b.setMaxRowGroupSize(opts.rowGroupSize); notes.push(`row_group_size=${opts.rowGroupSize}`); }
  if (opts.rowGroupBytes !== undefined) { b = b.setMaxRowGroupBytes(opts.rowGroupBytes); notes.push(`row_group_bytes=${opts.rowGroupBytes}`); }
  if (opts.pageSize !== undefined) { b = b.setDataPageSizeLimit(opts.pageSize); notes.push(`page_size=${opts.pageSize}`); }
  if (opts.dictPageSize !== undefined) { b = b.setDictionaryPageSizeLimit(opts.dictPageSize); notes.push(`dict_page_size=${opts.dictPageSize}`); }
  if (opts.writeBatchSize !== undefined) { b = b.setWriteBatchSize(opts.writeBatchSize); notes.push(`write_batch_size=${opts.writeBatchSize}`); }
  if (opts.statistics !== undefined) {
    const s = STATISTICS[opts.statistics];
    if (s === undefined) throw new Error('--statistics must be none, chunk or page');
    b = b.setStatisticsEnabled(s);
    notes.push(`statistics=${opts.statistics}`);
  }
  return { props: b.build(), notes };
}

/** JSON rows + normalized schema + options -> Parquet bytes (Uint8Array). */
export function writeRows(rows, schema, opts) {
  const table = rowsToArrowTable(rows, schema);
  const { props, notes } = buildWriterProperties(schema, opts);
  if (opts.verbose) process.stderr.write(`write: ${rows.length} rows; ${notes.join('; ')}\n`);
  try {
    const wasmTable = pw.Table.fromIPCStream(arrow.tableToIPC(table, 'stream'));
    return pw.writeParquet(wasmTable, props);
  } catch (e) {
    // A Rust panic surfaces as a bare "unreachable" trap and leaves the wasm instance unusable.
    if (e instanceof WebAssembly.RuntimeError) throw new Error(`parquet-wasm panicked (${e.message}); options not valid for this data?`);
    throw e;
  }
}

/** Load the schema named in opts, or infer one from the rows. */
export function loadSchema(rows, opts) {
  if (opts.schemaPath) return normalizeSchema(JSON.parse(readFileSync(opts.schemaPath, 'utf8')));
  return normalizeSchema(inferSchema(rows));
}

function main() {
  try {
    const { opts, positional } = parseWriteArgs(process.argv.slice(2));
    if (positional.length !== 2) throw new Error('usage: node write.mjs ROWS.jsonl OUT.parquet [options] (see the header of write.mjs)');
    const [inPath, outPath] = positional;
    const rows = readJsonl(inPath);
    const schema = loadSchema(rows, opts);
    writeFileSync(outPath, writeRows(rows, schema, opts));
  } catch (e) {
    die(e.message);
  }
}

if (process.argv[1] && import.meta.url === pathToFileURL(realpathSync(process.argv[1])).href) main();
