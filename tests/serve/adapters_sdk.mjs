// The official `openai` npm client against `jumbo serve --adapter ...`: models.list() shows the
// base and each adapter (parent = the base), models.retrieve() an adapter, a completion whose
// model is an adapter's name gives that adapter's text (as `jumbo generate --adapter`) and
// echoes its name, a stream likewise, and an unknown model is the SDK's NotFoundError.
//
//   JUMBO_NPM_PREFIX=DIR node adapters_sdk.mjs PORT BASE CASES.json
//
// CASES.json: serve_adapters.sh's greedy cases. Prints one FAIL line per failure and exits 1
// if there was one.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { homedir } from "node:os";
import { pathToFileURL } from "node:url";

const [port, base, casesPath] = process.argv.slice(2);
const prefix = process.env.JUMBO_NPM_PREFIX || join(homedir(), ".cache/jumbo/npm");
const sdk = await import(pathToFileURL(join(prefix, "node_modules/openai/index.mjs")).href);
const OpenAI = sdk.default;
const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: "none",
                            maxRetries: 0, timeout: 120000 });
const cases = JSON.parse(readFileSync(casesPath, "utf8"));

let failures = 0;
const fail = (message) => {
  failures += 1;
  console.log(`FAIL: sdk ${message}`);
};

const listed = [];
for await (const m of client.models.list()) listed.push(m);
const adapters = [...new Set(cases.map((c) => c.model).filter((m) => m !== base))].sort();
const ids = listed.map((m) => m.id);
if (ids[0] !== base || JSON.stringify(ids.slice(1).sort()) !== JSON.stringify(adapters)) {
  fail(`models.list(): ${JSON.stringify(ids)}, expected ${base} then ${adapters}`);
}
for (const m of listed.slice(1)) {
  if (m.parent !== base) fail(`models.list(): ${m.id} has parent ${m.parent}`);
}
const one = await client.models.retrieve(adapters[0]);
if (one.id !== adapters[0] || one.lora?.rank === undefined) fail(`models.retrieve: ${JSON.stringify(one)}`);

for (const c of cases) {
  const r = await client.completions.create({ model: c.model, prompt: c.prompt, seed: c.seed,
                                              temperature: c.temperature, max_tokens: c.max_tokens });
  if (r.model !== c.model || r.choices[0].text !== c.text) {
    fail(`${c.model} ${JSON.stringify(c.prompt)}: ${r.model} ${JSON.stringify(r.choices[0].text)}, ` +
         `expected ${JSON.stringify(c.text)}`);
  }
}
const streamed = cases.find((c) => c.model !== base);
let text = "";
const stream = await client.completions.create({ model: streamed.model, prompt: streamed.prompt,
                                                 seed: streamed.seed, max_tokens: streamed.max_tokens,
                                                 temperature: streamed.temperature, stream: true });
for await (const chunk of stream) text += chunk.choices[0]?.text ?? "";
if (text !== streamed.text) fail(`stream of ${streamed.model}: ${JSON.stringify(text)}`);
try {
  await client.completions.create({ model: "no-such-adapter", prompt: "x", max_tokens: 1 });
  fail("an unknown model was served");
} catch (e) {
  if (!(e instanceof sdk.NotFoundError)) fail(`an unknown model: ${e}`);
}
console.log(`sdk: ${listed.length} models listed, ${cases.length} completions and a stream over ` +
            `${adapters.length} adapters as jumbo generate`);
process.exit(failures ? 1 : 0);
