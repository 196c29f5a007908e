// The official OpenAI client against `grpo serve`, for tests/serve/serve_test.py and bench/serve.py.
// stdin: {"base": URL, "key": KEY, "calls": [{"kind", "body"}], "load": {"clients", "bodies", "stream"}}
// stdout: {"calls": [result, ...], "load": {...}}; a result is {"ok": true, "response"} (a stream: the
// list of chunks as "chunks", and the helper's final completion as "final" for kind "chat_helper") or
// {"ok": false, "status", "name", "error"} for an APIError.
import OpenAI from "openai";

const input = JSON.parse(await new Promise((resolve) => {
  let s = "";
  process.stdin.on("data", (d) => (s += d));
  process.stdin.on("end", () => resolve(s));
}));
const client = new OpenAI({ baseURL: input.base, apiKey: input.key || "none", maxRetries: 0, timeout: 600000 });

async function one(call) {
  try {
    const b = call.body;
    switch (call.kind) {
      case "completions":
        return { ok: true, response: await client.completions.create(b) };
      case "chat":
        return { ok: true, response: await client.chat.completions.create(b) };
      case "completions_stream":
      case "chat_stream": {
        const api = call.kind === "chat_stream" ? client.chat.completions : client.completions;
        const chunks = [];
        for await (const c of await api.create({ ...b, stream: true })) chunks.push(c);
        return { ok: true, chunks };
      }
      case "chat_parse":  // the SDK's structured-output helper: message.parsed from a json_schema answer
        return { ok: true, response: await client.chat.completions.parse(b) };
      case "chat_helper": {  // the SDK's own accumulation of a chat stream (content and tool calls)
        const runner = client.chat.completions.stream(b);
        const chunks = [];
        for await (const c of runner) chunks.push(c);
        return { ok: true, chunks, final: await runner.finalChatCompletion() };
      }
      case "models":
        return { ok: true, response: await client.models.list() };
      case "model":  // models.retrieve(id): GET /models/{id}
        return { ok: true, response: await client.models.retrieve(b.id) };
      default:
        throw new Error(`unknown kind ${call.kind}`);
    }
  } catch (e) {
    if (e instanceof OpenAI.APIError)
      return { ok: false, status: e.status ?? null, name: e.constructor.name, error: e.error ?? null,
               retry_after: e.headers?.get?.("retry-after") ?? null };
    return { ok: false, status: null, name: e.constructor.name, error: String(e) };
  }
}

const out = { calls: [] };
for (const call of input.calls || []) out.calls.push(await one(call));

// A streamed completion (a chat completion when the body has messages) for load runs: its time to the first
// token, and the usage chunk's counts.
async function timedStream(body, t) {
  try {
    let first = null, usage = null;
    const chat = "messages" in body;
    const api = chat ? client.chat.completions : client.completions;
    const s = await api.create({ ...body, stream: true, stream_options: { include_usage: true } });
    for await (const c of s) {
      const piece = c.choices.length ? (chat ? c.choices[0].delta.content : c.choices[0].text) : null;
      if (first === null && piece) first = (performance.now() - t) / 1000;
      if (c.usage) usage = c.usage;
    }
    return { ok: true, ttft: first, usage };
  } catch (e) {
    return { ok: false, status: e.status ?? null, error: String(e) };
  }
}

// Load: `clients` workers take the bodies in turn (completions; streamed with "stream": true) and time each.
if (input.load) {
  const { clients, bodies, stream } = input.load;
  const results = new Array(bodies.length);
  let next = 0;
  const t0 = performance.now();
  async function worker() {
    while (next < bodies.length) {
      const i = next++;
      const t = performance.now();
      const r = stream ? await timedStream(bodies[i], t) : await one({ kind: "completions", body: bodies[i] });
      results[i] = { ...r, seconds: (performance.now() - t) / 1000 };
    }
  }
  await Promise.all(Array.from({ length: clients }, worker));
  out.load = { results, seconds: (performance.now() - t0) / 1000 };
}
process.stdout.write(JSON.stringify(out));
