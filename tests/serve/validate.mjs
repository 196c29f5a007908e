// The JSON Schema validator ajv (npm) over texts: stdin {"schema": S, "texts": [...]}; stdout, per text, whether
// JSON.parse reads it and ajv accepts what it read.
import Ajv from "ajv";

let input = "";
for await (const chunk of process.stdin) input += chunk;
const { schema, texts } = JSON.parse(input);
const check = new Ajv().compile(schema);
const out = texts.map((t) => {
  try {
    return check(JSON.parse(t)) === true;
  } catch {
    return false;
  }
});
process.stdout.write(JSON.stringify(out));
