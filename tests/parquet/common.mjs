// Shared helpers for the Parquet peer scripts (write.mjs, read.mjs, gen.mjs, verify.mjs):
//   - the JSON schema form and its mapping to apache-arrow types,
//   - schema inference from JSON rows,
//   - coercion of JSON values into what the apache-arrow builders expect,
//   - the canonical "dump" convention shared by both readers.
//
// Schema JSON form:
//   {"fields": [FIELD, ...]}
//   FIELD = {"name": "x", "type": TYPE, "nullable": true}        (nullable defaults to true)
//   TYPE  = "utf8" | "binary" | "int32" | "int64" | "float32" | "float64" | "bool"
//         | {"struct": [FIELD, ...]}
//         | {"list": TYPE, "element_nullable": true}               (element_nullable defaults to true)
//         | {"map": {"key": TYPE, "value": TYPE}, "value_nullable": true}
//
// Value conventions (JSON rows in, dump out):
//   binary   a base64 string (an encoded image, as `datasets` stores one)
//   int64    JSON number when it is a safe integer, else a string of decimal digits
//   float*   JSON number; NaN/Infinity/-Infinity as the strings "NaN", "Infinity", "-Infinity".
//            float32 values come back as the double the float32 holds (Math.fround).
//   struct   object with keys in schema order; list -> array; map -> object (keys as strings)
//   null     null

import { readFileSync } from 'node:fs';
import * as arrow from 'apache-arrow';

export const PRIMITIVES = ['utf8', 'binary', 'int32', 'int64', 'float32', 'float64', 'bool'];

export function die(msg) {
  process.stderr.write(`error: ${msg}\n`);
  process.exit(2);
}

// ---------------------------------------------------------------- JSON I/O

/** Parse a JSONL file: one JSON object per non-empty line. */
export function readJsonl(path) {
  const rows = [];
  const lines = readFileSync(path, 'utf8').split('\n');
  lines.forEach((line, i) => {
    if (line.trim() === '') return;
    let v;
    try { v = JSON.parse(line); } catch (e) { throw new Error(`${path}:${i + 1}: invalid JSON: ${e.message}`); }
    if (v === null || typeof v !== 'object' || Array.isArray(v)) {
      throw new Error(`${path}:${i + 1}: each line must be a JSON object`);
    }
    rows.push(v);
  });
  return rows;
}

// ---------------------------------------------------------------- schema

/** Validate a schema JSON object and fill in defaults; returns a normalized copy. */
export function normalizeSchema(schema) {
  if (!schema || !Array.isArray(schema.fields)) throw new Error('schema must be {"fields": [...]}');
  return { fields: schema.fields.map((f, i) => normField(f, `fields[${i}]`)) };
}

function normField(f, where) {
  if (!f || typeof f.name !== 'string') throw new Error(`${where}: field needs a string "name"`);
  if (f.nullable !== undefined && typeof f.nullable !== 'boolean') throw new Error(`${where}: "nullable" must be a boolean`);
  return { name: f.name, type: normType(f.type, `${where}(${f.name})`), nullable: f.nullable ?? true };
}

function normType(t, where) {
  if (typeof t === 'string') {
    if (!PRIMITIVES.includes(t)) throw new Error(`${where}: unknown type "${t}" (want one of ${PRIMITIVES.join(', ')}, struct, list, map)`);
    return t;
  }
  if (t && typeof t === 'object') {
    if (Array.isArray(t.struct)) return { struct: t.struct.map((f, i) => normField(f, `${where}.struct[${i}]`)) };
    if (t.list !== undefined) return { list: normType(t.list, `${where}.list`), element_nullable: t.element_nullable ?? true };
    if (t.map && typeof t.map === 'object') {
      return {
        map: { key: normType(t.map.key, `${where}.map.key`), value: normType(t.map.value, `${where}.map.value`) },
        value_nullable: t.value_nullable ?? true,
      };
    }
  }
  throw new Error(`${where}: bad type ${JSON.stringify(t)}`);
}

/** Schema JSON type -> apache-arrow DataType. List elements are named "element" (Parquet spec). */
export function arrowType(t) {
  switch (t) {
    case 'utf8': return new arrow.Utf8();
    case 'binary': return new arrow.Binary();
    case 'int32': return new arrow.Int32();
    case 'int64': return new arrow.Int64();
    case 'float32': return new arrow.Float32();
    case 'float64': return new arrow.Float64();
    case 'bool': return new arrow.Bool();
  }
  if (t.struct) return new arrow.Struct(t.struct.map(arrowField));
  if (t.list) return new arrow.List(new arrow.Field('element', arrowType(t.list), t.element_nullable));
  if (t.map) {
    const entries = new arrow.Struct([
      new arrow.Field('key', arrowType(t.map.key), false),
      new arrow.Field('value', arrowType(t.map.value), t.value_nullable),
    ]);
    return new arrow.Map_(new arrow.Field('key_value', entries, false));
  }
  throw new Error(`bad type ${JSON.stringify(t)}`);
}

export function arrowField(f) {
  return new arrow.Field(f.name, arrowType(f.type), f.nullable);
}

export function arrowSchema(schema) {
  return new arrow.Schema(schema.fields.map(arrowField));
}

/** Leaf (primitive) columns as {path: [names...], type, topLevel}. Mirrors Parquet leaf columns. */
export function leafColumns(schema) {
  const out = [];
  const walk = (t, path) => {
    if (typeof t === 'string') out.push({ path, type: t, topLevel: path.length === 1 });
    else if (t.struct) t.struct.forEach((f) => walk(f.type, [...path, f.name]));
    else if (t.list) walk(t.list, [...path, 'list', 'element']);
    else if (t.map) { walk(t.map.key, [...path, 'key_value', 'key']); walk(t.map.value, [...path, 'key_value', 'value']); }
  };
  schema.fields.forEach((f) => walk(f.type, [f.name]));
  return out;
}

// ---------------------------------------------------------------- inference

/**
 * Infer a schema from JSON rows: strings -> utf8, integers -> int64, other numbers -> float64,
 * booleans -> bool, objects -> struct (keys in first-seen order), arrays -> list.
 * Everything is nullable; an all-null column becomes utf8.
 */
export function inferSchema(rows) {
  const root = inferValues(rows, '$');
  if (!root || !root.struct) throw new Error('cannot infer a schema from zero rows; pass --schema');
  return finalizeInferred({ fields: root.struct });
}

function inferValues(values, where) {
  let t = null; // null = unknown so far
  for (const v of values) t = mergeType(t, typeOfValue(v, where), where);
  return t;
}

function typeOfValue(v, where) {
  if (v === null || v === undefined) return null;
  if (typeof v === 'string') return 'utf8';
  if (typeof v === 'boolean') return 'bool';
  if (typeof v === 'number') return Number.isInteger(v) ? 'int64' : 'float64';
  if (Array.isArray(v)) return { list: inferValues(v, `${where}[]`) ?? null, element_nullable: true };
  if (typeof v === 'object') {
    return { struct: Object.keys(v).map((k) => ({ name: k, type: typeOfValue(v[k], `${where}.${k}`), nullable: true })) };
  }
  throw new Error(`${where}: cannot infer a type for ${typeof v}`);
}

function mergeType(a, b, where) {
  if (a === null) return b;
  if (b === null) return a;
  if (typeof a === 'string' && typeof b === 'string') {
    if (a === b) return a;
    if ((a === 'int64' && b === 'float64') || (a === 'float64' && b === 'int64')) return 'float64';
  } else if (a.list !== undefined && b.list !== undefined) {
    return { list: mergeType(a.list, b.list, `${where}[]`), element_nullable: true };
  } else if (a.struct && b.struct) {
    const fields = a.struct.map((f) => ({ ...f }));
    for (const g of b.struct) {
      const f = fields.find((x) => x.name === g.name);
      if (f) f.type = mergeType(f.type, g.type, `${where}.${g.name}`);
      else fields.push({ ...g });
    }
    return { struct: fields };
  }
  throw new Error(`${where}: values mix ${describe(a)} and ${describe(b)}; pass --schema`);
}

const describe = (t) => (typeof t === 'string' ? t : Object.keys(t)[0]);

/** Replace still-unknown (all-null) types by utf8. */
function finalizeInferred(schema) {
  const fix = (t) => {
    if (t === null) return 'utf8';
    if (typeof t === 'string') return t;
    if (t.list !== undefined) return { list: fix(t.list), element_nullable: true };
    return { struct: t.struct.map((f) => ({ ...f, type: fix(f.type) })) };
  };
  return { fields: schema.fields.map((f) => ({ ...f, type: fix(f.type) })) };
}

// ---------------------------------------------------------------- coercion (JSON -> arrow builder input)

const INT64_MIN = -(2n ** 63n);
const INT64_MAX = 2n ** 63n - 1n;

function parseFloatish(v, where) {
  if (typeof v === 'number') return v;
  if (v === 'NaN') return NaN;
  if (v === 'Infinity') return Infinity;
  if (v === '-Infinity') return -Infinity;
  throw new Error(`${where}: expected a number, got ${JSON.stringify(v)}`);
}

/** Convert one JSON value to the JS value apache-arrow's builder wants for type t; throws on mismatch. */
export function coerce(v, t, nullable, where) {
  if (v === null || v === undefined) {
    if (!nullable) throw new Error(`${where}: null in a non-nullable field`);
    return null;
  }
  switch (t) {
    case 'utf8':
      if (typeof v !== 'string') throw new Error(`${where}: expected a string, got ${JSON.stringify(v)}`);
      return v;
    case 'binary':
      if (typeof v !== 'string') throw new Error(`${where}: expected a base64 string, got ${JSON.stringify(v)}`);
      return new Uint8Array(Buffer.from(v, 'base64'));
    case 'bool':
      if (typeof v !== 'boolean') throw new Error(`${where}: expected a boolean, got ${JSON.stringify(v)}`);
      return v;
    case 'int32':
      if (!Number.isInteger(v) || v < -(2 ** 31) || v >= 2 ** 31) throw new Error(`${where}: expected an int32, got ${JSON.stringify(v)}`);
      return v;
    case 'int64': {
      let b;
      if (typeof v === 'number') {
        if (!Number.isSafeInteger(v)) throw new Error(`${where}: int64 ${v} is not a safe integer; write values beyond 2^53 as strings of digits`);
        b = BigInt(v);
      } else if (typeof v === 'string' && /^-?[0-9]+$/.test(v)) {
        b = BigInt(v);
      } else {
        throw new Error(`${where}: expected an int64 (number or string of digits), got ${JSON.stringify(v)}`);
      }
      if (b < INT64_MIN || b > INT64_MAX) throw new Error(`${where}: ${v} is out of int64 range`);
      return b;
    }
    case 'float32':
    case 'float64':
      return parseFloatish(v, where);
  }
  if (t.struct) {
    if (typeof v !== 'object' || Array.isArray(v)) throw new Error(`${where}: expected an object, got ${JSON.stringify(v).slice(0, 80)}`);
    for (const k of Object.keys(v)) {
      if (!t.struct.some((f) => f.name === k)) throw new Error(`${where}: key "${k}" is not in the struct's schema`);
    }
    const out = {};
    for (const f of t.struct) out[f.name] = coerce(v[f.name], f.type, f.nullable, `${where}.${f.name}`);
    return out;
  }
  if (t.list) {
    if (!Array.isArray(v)) throw new Error(`${where}: expected an array, got ${JSON.stringify(v).slice(0, 80)}`);
    return v.map((x, i) => coerce(x, t.list, t.element_nullable, `${where}[${i}]`));
  }
  if (t.map) {
    if (typeof v !== 'object' || Array.isArray(v)) throw new Error(`${where}: expected an object for a map`);
    const m = new Map();
    for (const [k, x] of Object.entries(v)) {
      m.set(coerce(mapKeyFromString(k, t.map.key, where), t.map.key, false, `${where}{key}`),
        coerce(x, t.map.value, t.value_nullable, `${where}[${JSON.stringify(k)}]`));
    }
    return m;
  }
  throw new Error(`${where}: bad type`);
}

// JSON object keys are strings; map keys of numeric type are written as their decimal text.
function mapKeyFromString(k, keyType, where) {
  if (keyType === 'utf8') return k;
  if (keyType === 'int64') return k;
  if (keyType === 'int32' || keyType === 'float32' || keyType === 'float64') return Number(k);
  if (keyType === 'bool') return k === 'true';
  throw new Error(`${where}: unsupported map key type`);
}

/** Build an apache-arrow Table from JSON rows with exactly the schema's types and nullability. */
export function rowsToArrowTable(rows, schema) {
  const structType = new arrow.Struct(schema.fields.map(arrowField));
  const values = rows.map((r, i) => coerce(r, { struct: schema.fields }, false, `row ${i + 1}`));
  const aschema = arrowSchema(schema);
  if (rows.length === 0) return new arrow.Table(aschema);
  const vec = arrow.vectorFromArray(values, structType);
  const batches = vec.data.map((d) => new arrow.RecordBatch(aschema, d));
  return new arrow.Table(aschema, batches);
}

// ---------------------------------------------------------------- dump convention (reader output)

/** Canonical JSON value for a scalar coming out of either reader. */
export function canonScalar(v) {
  if (v === null || v === undefined) return null;
  if (typeof v === 'bigint') return v >= BigInt(Number.MIN_SAFE_INTEGER) && v <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(v) : v.toString();
  if (typeof v === 'number') {
    if (Number.isNaN(v)) return 'NaN';
    if (v === Infinity) return 'Infinity';
    if (v === -Infinity) return '-Infinity';
    return v;
  }
  if (typeof v === 'string' || typeof v === 'boolean') return v;
  if (v instanceof Uint8Array) return Buffer.from(v).toString('base64'); // binary: base64
  if (v instanceof Date) return v.toISOString();
  return v;
}

/**
 * Canonicalize a value from an untyped reader (hyparquet): scalars via canonScalar, arrays and
 * typed arrays element-wise, Maps and plain objects key-wise (insertion order kept).
 */
export function canonGeneric(v) {
  if (Array.isArray(v) || (ArrayBuffer.isView(v) && !(v instanceof Uint8Array) && !(v instanceof DataView))) {
    return Array.from(v, canonGeneric);
  }
  if (v instanceof Map) {
    const o = {};
    for (const [k, x] of v) o[String(canonScalar(k))] = canonGeneric(x);
    return o;
  }
  if (v && typeof v === 'object' && !(v instanceof Uint8Array) && !(v instanceof Date)) {
    const o = {};
    for (const k of Object.keys(v)) o[k] = canonGeneric(v[k]);
    return o;
  }
  return canonScalar(v);
}

/** Deep equality of canonical JSON values (object key order ignored, array order kept). */
export function jsonEqual(a, b) {
  if (a === b) return true;
  if (a === null || b === null || typeof a !== 'object' || typeof b !== 'object') return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  if (Array.isArray(a)) return a.length === b.length && a.every((x, i) => jsonEqual(x, b[i]));
  const ka = Object.keys(a);
  const kb = Object.keys(b);
  return ka.length === kb.length && ka.every((k) => Object.hasOwn(b, k) && jsonEqual(a[k], b[k]));
}

/** Path and values of the first difference between two canonical JSON values, or null if equal. */
export function firstDiff(a, b, path = '$') {
  if (jsonEqual(a, b)) return null;
  if (a && b && typeof a === 'object' && typeof b === 'object' && Array.isArray(a) === Array.isArray(b)) {
    if (Array.isArray(a)) {
      for (let i = 0; i < Math.min(a.length, b.length); i++) {
        const d = firstDiff(a[i], b[i], `${path}[${i}]`);
        if (d) return d;
      }
      return { path: `${path}.length`, a: a.length, b: b.length };
    }
    for (const k of new Set([...Object.keys(a), ...Object.keys(b)])) {
      const d = firstDiff(a[k], b[k], `${path}.${k}`);
      if (d) return d;
    }
  }
  if (typeof a === 'string' && typeof b === 'string') {
    let k = 0;
    while (k < a.length && a[k] === b[k]) k++;
    const at = Math.max(0, k - 30);
    return { path: `${path} (char ${k})`, a: `…${a.slice(at, k + 50)}`, b: `…${b.slice(at, k + 50)}` };
  }
  return { path, a, b };
}
