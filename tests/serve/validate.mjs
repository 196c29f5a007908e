// The JSON Schema validator ajv (npm) over texts: stdin {"schema": S, "texts": [...]}; stdout, per text, whether
// JSON.parse reads it and ajv accepts what it read (formats checked by ajv-formats, in its "full" mode).
import Ajv from "ajv";
import addFormats from "ajv-formats";

let input = "";
for await (const chunk of process.stdin) input += chunk;
const { schema, texts } = JSON.parse(input);
const check = addFormats(new Ajv(), { mode: "full" }).compile(schema);
const out = texts.map((t) => {
  try {
    return check(JSON.parse(t)) === true;
  } catch {
    return false;
  }
});
process.stdout.write(JSON.stringify(out));
