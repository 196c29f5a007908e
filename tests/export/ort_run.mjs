// The ONNX runtimes' side of export_test.py: reads a JSON array of requests on stdin, answers a JSON array.
// Each request names an exported folder ("model") and the graph in it ("file", e.g. "onnx/model.onnx"):
//   {"score": ids}: one pass with an empty cache; the log-prob of each next id (n - 1 of them)
//   {"prompt": ids, "n": K}: a prefill then K - 1 one-token steps through the KV cache, each picking the
//     largest logit: {"tokens", "logprobs"}
//   {"batch": [ids, ...]}: the sequences left-padded into one pass (attention_mask 0 on the pads, positions
//     counted from each sequence's first token): each one's next-id log-probs
//   {"transformers": ids, "n": K, "dtype": "fp32"|"fp16"}: transformers.js loads the folder and its greedy
//     generate's K new ids: {"tokens"}
//   {"bench": true, "prompt": ids, "n": K} (bench/export.py): after a warm-up pass, the seconds of the prompt's
//     prefill and of K greedy tokens after it: {"prefill_seconds", "decode_seconds", "decoded"}
//   {"vision": FILE}: the patches of vl_tool --features' FILE (int32 t, h, w, patch dim, out_hidden; the float32
//     patches) through a vision graph ("file": onnx/vision_encoder.onnx): {"features": flat float32 values}
//   {"image": FILE, "dims": [1, 3, H, W]}: FILE's float32 RGB values (0..255, NCHW) through a vision graph that
//     takes the image itself (onnx/vision_encoder_image.onnx): {"features"}
//   {"classify": [ids, ...], "pad": "right"|"left"}: a reward model's graph on the sequences padded (id 0,
//     attention_mask 0) into one batch: each one's logits (labels)
//   {"vl": FILE, "ids": ids, "n": K, "dtype"}: transformers.js loads a VL folder; its greedy generate's K new ids
//     after ids (the image's pads among them) with FILE's patches as pixel_values: {"tokens"}
// Log-probs: log-softmax of the float32 logits, in double.
import {readFileSync} from "node:fs";
import * as path from "node:path";
import * as ort from "onnxruntime-node";

const sessions = new Map();

async function open(req) {
    const file = path.join(req.model, req.file);
    if (!sessions.has(file)) {
        const cfg = JSON.parse(readFileSync(path.join(req.model, "config.json"), "utf8"));
        const sess = await ort.InferenceSession.create(file, {intraOpNumThreads: 2});
        const layers = cfg.num_hidden_layers, kvh = cfg.num_key_value_heads ?? cfg.num_attention_heads;
        const D = cfg.head_dim ?? cfg.hidden_size / cfg.num_attention_heads;
        sessions.set(file, {sess, layers, kvh, D});
    }
    return sessions.get(file);
}

const ids64 = (a) => BigInt64Array.from(a.map((x) => BigInt(x)));

// One pass of B rows of equal length (ids, mask and positions as arrays of rows) after `past` (null: none).
async function forward(s, ids, mask, pos, past) {
    const B = ids.length, S = ids[0].length, T = mask[0].length;
    const feeds = {
        input_ids: new ort.Tensor("int64", ids64(ids.flat()), [B, S]),
        attention_mask: new ort.Tensor("int64", ids64(mask.flat()), [B, T]),
        position_ids: new ort.Tensor("int64", ids64(pos.flat()), [B, S]),
    };
    for (let l = 0; l < s.layers; l++) {
        for (const kind of ["key", "value"]) {
            const none = new ort.Tensor("float32", new Float32Array(0), [B, s.kvh, 0, s.D]);
            feeds[`past_key_values.${l}.${kind}`] = past ? past[`present.${l}.${kind}`] : none;
        }
    }
    return await s.sess.run(feeds);
}

// Row r of (B, S, V) logits: [log-probs as a function of id, argmax].
function row(logits, r) {
    const V = logits.dims[2];
    const x = logits.data.subarray(r * V, (r + 1) * V);
    let max = -Infinity, arg = 0;
    for (let i = 0; i < V; i++) {
        if (x[i] > max) {
            max = x[i];
            arg = i;
        }
    }
    let sum = 0;
    for (let i = 0; i < V; i++) sum += Math.exp(x[i] - max);
    const lse = max + Math.log(sum);
    return [(id) => x[id] - lse, arg];
}

const range = (a, n) => Array.from({length: n}, (_, i) => a + i);

async function score(s, ids) {
    const out = await forward(s, [ids], [ids.map(() => 1)], [range(0, ids.length)], null);
    return range(0, ids.length - 1).map((i) => row(out.logits, i)[0](ids[i + 1]));
}

// times: where to note the seconds of the prefill (prefill_seconds) and of the steps after (decode_seconds).
async function greedy(s, prompt, n, times = {}) {
    const t0 = performance.now();
    let out = await forward(s, [prompt], [prompt.map(() => 1)], [range(0, prompt.length)], null);
    const t1 = performance.now();
    const tokens = [], logprobs = [];
    let T = prompt.length;
    for (let k = 0; k < n; k++) {
        const [lp, arg] = row(out.logits, out.logits.dims[1] - 1);
        tokens.push(arg);
        logprobs.push(lp(arg));
        if (k === n - 1) break;
        out = await forward(s, [[arg]], [range(0, T + 1).map(() => 1)], [[T]], out);
        T++;
    }
    times.prefill_seconds = (t1 - t0) / 1000;
    times.decode_seconds = (performance.now() - t1) / 1000;
    return {tokens, logprobs};
}

async function batch(s, seqs) {
    const T = Math.max(...seqs.map((x) => x.length));
    const pad = seqs.map((x) => T - x.length);
    const ids = seqs.map((x, b) => [...Array(pad[b]).fill(0), ...x]);
    const mask = seqs.map((x, b) => range(0, T).map((i) => (i < pad[b] ? 0 : 1)));
    const pos = seqs.map((x, b) => range(0, T).map((i) => Math.max(i - pad[b], 0)));
    const out = await forward(s, ids, mask, pos, null);
    return seqs.map((x, b) => range(0, x.length - 1).map((i) => row(out.logits, b * T + pad[b] + i)[0](x[i + 1])));
}

async function transformers(req) {
    const {AutoModelForCausalLM, Tensor, env} = await import("@huggingface/transformers");
    env.allowRemoteModels = false;
    env.localModelPath = path.dirname(req.model) + "/";
    const model = await AutoModelForCausalLM.from_pretrained(path.basename(req.model), {dtype: req.dtype});
    const ids = req.transformers;
    const input_ids = new Tensor("int64", ids64(ids), [1, ids.length]);
    const attention_mask = new Tensor("int64", ids64(ids.map(() => 1)), [1, ids.length]);
    const out = await model.generate({input_ids, attention_mask, max_new_tokens: req.n, do_sample: false});
    await model.dispose();
    return {tokens: Array.from(out.data, Number).slice(ids.length)};
}

// vl_tool --features' file: the grid and the patches.
function patches(file) {
    const buf = readFileSync(file);
    const [t, h, w, dim] = [0, 1, 2, 3].map((i) => buf.readInt32LE(4 * i));
    const n = t * h * w;
    const data = new Float32Array(buf.buffer.slice(buf.byteOffset + 20, buf.byteOffset + 20 + 4 * n * dim));
    return {grid: [t, h, w], n, dim, data};
}

async function vision(req) {
    const p = patches(req.vision);
    const sess = await ort.InferenceSession.create(path.join(req.model, req.file), {intraOpNumThreads: 2});
    const feeds = {pixel_values: new ort.Tensor("float32", p.data, [p.n, p.dim])};
    feeds[sess.inputNames[1]] = new ort.Tensor("int64", ids64(p.grid), [1, 3]);  // (image_)grid_thw
    const out = await sess.run(feeds);
    return {features: Array.from(out.image_features.data)};
}

// {"image": FILE, "dims": [1, 3, H, W]}: FILE's float32 RGB values through a graph taking the image itself.
async function vision_image(req) {
    const buf = readFileSync(req.image);
    const data = new Float32Array(buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.length));
    const sess = await ort.InferenceSession.create(path.join(req.model, req.file), {intraOpNumThreads: 2});
    const out = await sess.run({image: new ort.Tensor("float32", data, req.dims)});
    return {features: Array.from(out.image_features.data)};
}

async function classify(req) {
    const sess = await ort.InferenceSession.create(path.join(req.model, req.file), {intraOpNumThreads: 2});
    const seqs = req.classify, B = seqs.length, T = Math.max(...seqs.map((x) => x.length));
    const pad = (row) => {
        const fill = Array(T - row.length).fill(0);
        return req.pad === "left" ? [...fill, ...row] : [...row, ...fill];
    };
    const ids = seqs.map(pad), mask = seqs.map((x) => pad(x.map(() => 1)));
    const out = await sess.run({
        input_ids: new ort.Tensor("int64", ids64(ids.flat()), [B, T]),
        attention_mask: new ort.Tensor("int64", ids64(mask.flat()), [B, T]),
    });
    const L = out.logits.dims[1];
    return range(0, B).map((b) => Array.from(out.logits.data.subarray(b * L, (b + 1) * L)));
}

async function transformers_vl(req) {
    const {AutoModelForImageTextToText, Tensor, env} = await import("@huggingface/transformers");
    env.allowRemoteModels = false;
    env.localModelPath = path.dirname(req.model) + "/";
    const model = await AutoModelForImageTextToText.from_pretrained(path.basename(req.model), {dtype: req.dtype});
    const p = patches(req.vl), ids = req.ids;
    const out = await model.generate({
        input_ids: new Tensor("int64", ids64(ids), [1, ids.length]),
        attention_mask: new Tensor("int64", ids64(ids.map(() => 1)), [1, ids.length]),
        pixel_values: new Tensor("float32", p.data, [p.n, p.dim]),
        image_grid_thw: new Tensor("int64", ids64(p.grid), [1, 3]),
        max_new_tokens: req.n,
        do_sample: false,
    });
    await model.dispose();
    return {tokens: Array.from(out.data, Number).slice(ids.length)};
}

const answers = [];
for (const req of JSON.parse(readFileSync(0, "utf8"))) {
    if (req.transformers || req.vision || req.vl || req.image || req.classify) {
        const f = req.vision ? vision : req.vl ? transformers_vl : req.image ? vision_image
            : req.classify ? classify : transformers;
        answers.push(await f(req));
        continue;
    }
    const s = await open(req);
    if (req.bench) {
        await forward(s, [req.prompt], [req.prompt.map(() => 1)], [range(0, req.prompt.length)], null);
        const times = {};
        const r = await greedy(s, req.prompt, req.n + 1, times);  // the prefill's token, then n more
        answers.push({...times, decoded: r.tokens.length - 1});
    } else if (req.score) answers.push(await score(s, req.score));
    else if (req.prompt) answers.push(await greedy(s, req.prompt, req.n));
    else if (req.batch) answers.push(await batch(s, req.batch));
    else throw new Error(`a request of nothing: ${JSON.stringify(req)}`);
}
process.stdout.write(JSON.stringify(answers));
