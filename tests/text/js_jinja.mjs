// Outside JS peer of jinja_parity.py: @huggingface/jinja (the engine of transformers.js) renders chat
// templates, @lenml/tokenizers encodes text, one process for a whole batch, JSONL in and out:
//
//   {"template": TEXT, "context": {...}}  -> {"text": s} or {"error": message}
//        context: every variable the template sees (jinja_ref.py's context(): messages, tools,
//        add_generation_prompt, the special tokens, the extra keyword arguments)
//   {"tokenizer": MODEL_DIR, "text": s}   -> {"ids": [...]}  (no BOS/EOS added; special-token text matched)
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { Template } from "@huggingface/jinja";
import { TokenizerLoader } from "@lenml/tokenizers";

const templates = new Map();
const tokenizers = new Map();

function template(text) {
  if (!templates.has(text)) {
    try {
      templates.set(text, new Template(text));
    } catch (e) {
      templates.set(text, e);  // a syntax error: every line of this template reports it
    }
  }
  const t = templates.get(text);
  if (t instanceof Error) throw t;
  return t;
}

function tokenizer(dir) {
  if (!tokenizers.has(dir)) {
    const read = (f) => JSON.parse(readFileSync(join(dir, f), "utf8"));
    tokenizers.set(dir, TokenizerLoader.fromPreTrained({
      tokenizerJSON: read("tokenizer.json"), tokenizerConfig: read("tokenizer_config.json"),
    }));
  }
  return tokenizers.get(dir);
}

function one(o) {
  if ("tokenizer" in o) return { ids: tokenizer(o.tokenizer).encode(o.text, { add_special_tokens: false }) };
  try {
    return { text: template(o.template).render(o.context) };
  } catch (e) {
    return { error: String(e && e.message ? e.message : e) };
  }
}

const out = [];
for (const line of readFileSync(0, "utf8").split("\n")) {
  if (line.trim() !== "") out.push(JSON.stringify(one(JSON.parse(line))));
}
process.stdout.write(out.length ? out.join("\n") + "\n" : "");
