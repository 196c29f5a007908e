// llama.cpp (node-llama-cpp's prebuilt CPU binary) on a GGUF file: the outside peer of grpo export's tests.
// usage: node llama_run.mjs < requests.json > answers.json
// requests: [{"model": FILE.gguf, and: "prompt": [ids], "n": K (greedy: K tokens after the prompt, each with its
// log-prob under the full softmax), or "prompt": [ids], "forced": [ids] (those tokens' log-probs, fed one by
// one), or "chat": [history items] (the file's chat template rendered by node-llama-cpp's Jinja wrapper, which leaves
// the last model turn open), or "tokenize": text (llama.cpp's tokenizer, special tokens' text as the tokens), or
// "detokenize": [ids] (the text of the ids, special tokens' as their text), or "bench": true, "prompt", "n"
// (bench/export.py: the seconds of the prompt's prefill and of n greedy tokens)}].
// Out: one answer per request, {"tokens", "logprobs"}, {"text"} or {"ids"}, each with the file's "architecture".
// The KV cache is F32 and flash attention off: llama.cpp's F16 cache default flips random models' near-ties.
import {getLlama, JinjaTemplateChatWrapper, LlamaLogLevel} from "node-llama-cpp";

const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error});
let path = null, model = null, context = null, sequence = null;

async function load(file) {  // the requests' files in turn, one loaded at a time
    if (file === path) return;
    if (model) {
        await context.dispose();
        await model.dispose();
    }
    path = file;
    model = await llama.loadModel({modelPath: file});
    context = await model.createContext({contextSize: 1024, batchSize: 1024, flashAttention: false, threads: 2,
                                         experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32"});
    sequence = context.getSequence();
}

// Log-probs of the next tokens: at each step llama.cpp's distribution over every token (temperature 1, no
// truncation) and the token fed next (forced[i], or the most likely one).
async function run(prompt, n, forced) {
    await sequence.clearHistory();
    const steps = sequence.evaluateWithMetadata(prompt, {probabilities: true},
                                                {temperature: 1, topK: 0, topP: 1, minP: 0});
    const tokens = [], logprobs = [];
    let r = await steps.next();
    for (let i = 0; i < n && !r.done; i++) {
        let best = -1, bestP = -1, sum = 0;
        for (const [t, p] of r.value.probabilities) {
            sum += p;
            if (p > bestP) [best, bestP] = [t, p];
        }
        const t = forced ? forced[i] : best;
        tokens.push(t);
        // llama.cpp normalizes in float32 over the whole vocabulary (its sums are 1 +- 2e-4 at 150k tokens):
        // normalized again here in double, the log-probs are its logits' log-softmax
        logprobs.push(Math.log((r.value.probabilities.get(t) ?? 0) / sum));
        if (i + 1 < n) r = await steps.next(t);
    }
    await steps.return();
    return {tokens, logprobs};
}

// bench/export.py's timing: the prompt's prefill, then n greedy tokens (seconds each, after the load).
async function bench(prompt, n) {
    await sequence.clearHistory();
    let t0 = performance.now();
    await sequence.evaluateWithoutGeneratingNewTokens(prompt);
    const prefill = (performance.now() - t0) / 1000;
    t0 = performance.now();
    let i = 0;
    for await (const t of sequence.evaluate([prompt[prompt.length - 1]], {temperature: 0})) {
        void t;
        if (++i === n) break;
    }
    return {prefill_seconds: prefill, decode_seconds: (performance.now() - t0) / 1000, decoded: i};
}

// All of stdin (readFileSync(0) fails with EAGAIN on a non-blocking pipe that a large request fills slowly).
async function stdin() {
    const chunks = [];
    for await (const c of process.stdin) chunks.push(c);
    return Buffer.concat(chunks).toString("utf8");
}

const out = [];
for (const q of JSON.parse(await stdin())) {
    await load(q.model);
    const meta = model.fileInfo.metadata;
    let a;
    if (q.chat) {
        const wrapper = new JinjaTemplateChatWrapper({template: meta.tokenizer.chat_template});
        const {contextText} = wrapper.generateContextState({chatHistory: q.chat});
        // its special tokens (the file's bos, a bare "BOS" in the text's own string) as their text
        a = {text: model.detokenize(contextText.tokenize(model.tokenizer), true)};
    } else if (q.bench) {
        a = await bench(q.prompt, q.n);
    } else if (q.tokenize !== undefined) {
        a = {ids: Array.from(model.tokenize(q.tokenize, true))};  // special tokens' text as the tokens
    } else if (q.detokenize) {
        a = {text: model.detokenize(q.detokenize, true)};
    } else {
        a = await run(q.prompt, q.forced ? q.forced.length : q.n, q.forced);
    }
    out.push({...a, architecture: meta.general.architecture});
}
console.log(JSON.stringify(out));
if (model) {
    await context.dispose();
    await model.dispose();
}
await llama.dispose();
