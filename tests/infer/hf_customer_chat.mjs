// The official `openai` npm client against `jumbo serve` of an imported Hugging Face Llama
// with two LoRA adapters (tests/infer/hf_customer_path.sh): chat completions rendered by the
// model's own Jinja template, greedy, each adapter giving the reply it was fine-tuned on and
// stopping at the template's end of turn (<|eot_id|>), and the base another reply.
//
//   JUMBO_NPM_PREFIX=DIR node hf_customer_chat.mjs PORT BASE_NAME
//
// Prints one line per reply and one FAIL line per failure; exits 1 if there was one.
import { join } from "node:path";
import { homedir } from "node:os";
import { pathToFileURL } from "node:url";

const [port, base] = process.argv.slice(2);
const prefix = process.env.JUMBO_NPM_PREFIX || join(homedir(), ".cache/jumbo/npm");
const sdk = await import(pathToFileURL(join(prefix, "node_modules/openai/index.mjs")).href);
const client = new sdk.default({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: "none",
                                 maxRetries: 0, timeout: 120000 });
let failures = 0;
const fail = (m) => { failures += 1; console.log(`FAIL: ${m}`); };

const conversations = [
  [{ role: "user", content: "What is the capital of Norway?" }],
  [{ role: "system", content: "You answer in one word." },
   { role: "user", content: "Name the capital of Kenya." }],
  [{ role: "user", content: "Hello" }, { role: "assistant", content: "Hi." },
   { role: "user", content: "Which city is the capital of Peru?" }],
];
const replies = {};
for (const [model, want] of [["paris", "Paris."], ["rome", "Rome."], [base, null]]) {
  for (const messages of conversations) {
    const r = await client.chat.completions.create({ model, messages, temperature: 0, max_tokens: 12 });
    const c = r.choices[0];
    console.log(`${model}: ${JSON.stringify(c.message.content)} (${c.finish_reason})`);
    if (r.model !== model) fail(`${model}: the reply names model ${r.model}`);
    if (want !== null) {
      if (c.message.content !== want) fail(`${model}: replied ${JSON.stringify(c.message.content)}, expected ${JSON.stringify(want)}`);
      if (c.finish_reason !== "stop") fail(`${model}: finish_reason ${c.finish_reason}, expected stop (at <|eot_id|>)`);
      if (c.message.content.includes("<|eot_id|>")) fail(`${model}: the stop token is in the reply`);
    }
    replies[model] = (replies[model] || []).concat(c.message.content);
  }
}
if (JSON.stringify(replies[base]) === JSON.stringify(replies.paris)) fail("the base replies as the paris adapter");
// A stream gives the same reply.
let streamed = "";
const stream = await client.chat.completions.create({ model: "rome", messages: conversations[0],
                                                       temperature: 0, max_tokens: 12, stream: true });
for await (const chunk of stream) streamed += chunk.choices[0]?.delta?.content ?? "";
if (streamed !== "Rome.") fail(`stream: ${JSON.stringify(streamed)}, expected "Rome."`);
process.exit(failures ? 1 : 0);
