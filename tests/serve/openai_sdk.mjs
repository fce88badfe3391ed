// The official `openai` npm client against a running `jumbo serve` (with --api-key and
// --chat-template): completions whole and streamed, n, logprobs, echo, include_usage,
// penalties, chat whole and streamed, models, and the SDK's own error classes for a wrong
// key, an unknown model and a bad field. Texts must equal `jumbo generate --json`'s.
//
//   JUMBO_API_KEY=KEY JUMBO_NPM_PREFIX=DIR node openai_sdk.mjs PORT EXPECT.json
//
// DIR holds node_modules/openai (scripts/install-deps.sh installs it into
// ~/.cache/jumbo/npm). EXPECT.json is what serve_api.sh builds. Prints one FAIL line per
// failure and exits 1 if there was one.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { homedir } from "node:os";
import { pathToFileURL } from "node:url";

const [port, expectPath] = process.argv.slice(2);
const prefix = process.env.JUMBO_NPM_PREFIX || join(homedir(), ".cache/jumbo/npm");
const sdk = await import(pathToFileURL(join(prefix, "node_modules/openai/index.mjs")).href);
const OpenAI = sdk.default;
const sdkVersion = JSON.parse(readFileSync(join(prefix, "node_modules/openai/package.json"), "utf8")).version;
const expect = JSON.parse(readFileSync(expectPath, "utf8"));
const model = expect.model;
const baseURL = `http://127.0.0.1:${port}/v1`;
const client = new OpenAI({ baseURL, apiKey: process.env.JUMBO_API_KEY, maxRetries: 0,
                            timeout: 120000 });

let failures = 0;
function fail(message) {
  failures += 1;
  console.log(`FAIL: sdk ${message}`);
}
const show = (x) => {
  const s = JSON.stringify(x);
  return s && s.length > 300 ? `${s.slice(0, 300)}... (${s.length} chars)` : s;
};
// One check: an exception (a response the SDK could not parse, an HTTP error) is a failure.
async function check(name, fn) {
  try {
    await fn();
    console.log(`sdk ${name}: done`);
  } catch (e) {
    fail(`${name}: ${e?.constructor?.name}: ${e?.status ?? ""} ${e?.message}`);
  }
}
const sampling = (c) => ({ model, prompt: c.prompt, max_tokens: c.max_tokens,
                           temperature: c.temperature, seed: c.seed });

const plain = expect.plain;
const chat = expect.chat;

await check("models.list", async () => {
  const page = await client.models.list();
  const ids = page.data.map((m) => m.id);
  if (JSON.stringify(ids) !== JSON.stringify([model])) fail(`models.list: ids ${show(ids)}`);
});

await check("models.retrieve", async () => {
  const m = await client.models.retrieve(model);
  if (m.id !== model || m.object !== "model" || typeof m.created !== "number") {
    fail(`models.retrieve(${model}): ${show(m)}`);
  }
});

await check("completions", async () => {
  if (!plain) return fail("completions: no expectation");
  const r = await client.completions.create(sampling(plain));
  const c = r.choices[0];
  if (c.text !== plain.text) fail(`completions: text ${show(c.text)} != ${show(plain.text)}`);
  if (c.finish_reason !== plain.finish_reason) fail(`completions: finish ${c.finish_reason}`);
  if (r.object !== "text_completion" || !r.id.startsWith("cmpl-") || r.model !== model) {
    fail(`completions: head ${show({ id: r.id, object: r.object, model: r.model })}`);
  }
  if (r.usage.completion_tokens !== plain.tokens.length ||
      r.usage.total_tokens !== r.usage.prompt_tokens + r.usage.completion_tokens) {
    fail(`completions: usage ${show(r.usage)} for ${plain.tokens.length} tokens`);
  }
});

await check("completions stream", async () => {
  if (!plain) return;
  const s = await client.completions.create({ ...sampling(plain), stream: true });
  let text = "";
  let finish = null;
  let chunks = 0;
  for await (const chunk of s) {
    chunks += 1;
    if (chunk.object !== "text_completion") fail(`stream: chunk ${show(chunk)}`);
    for (const c of chunk.choices) {
      text += c.text;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  if (text !== plain.text) fail(`stream: text ${show(text)} != ${show(plain.text)}`);
  if (finish !== plain.finish_reason) fail(`stream: finish ${finish} in ${chunks} chunks`);
});

await check("completions n 2", async () => {
  if (!plain) return;
  const r = await client.completions.create({ ...sampling(plain), n: 2 });
  if (r.choices.length !== 2 || r.choices[0].index !== 0 || r.choices[1].index !== 1) {
    return fail(`n 2: choices ${show(r.choices)}`);
  }
  if (r.choices[0].text !== plain.text) fail(`n 2: choice 0 ${show(r.choices[0].text)}`);
});

await check("completions logprobs 2", async () => {
  if (!plain) return;
  const r = await client.completions.create({ ...sampling(plain), logprobs: 2 });
  const c = r.choices[0];
  const lp = c.logprobs;
  if (!lp || lp.tokens.length !== plain.tokens.length) {
    return fail(`logprobs: ${show(lp)} for ${plain.tokens.length} tokens`);
  }
  if (lp.tokens.join("") !== c.text) fail(`logprobs: ${show(lp.tokens)} do not join into ${show(c.text)}`);
  let offset = 0;
  lp.tokens.forEach((t, i) => {
    if (lp.text_offset[i] !== offset) fail(`logprobs: text_offset[${i}] ${lp.text_offset[i]} != ${offset}`);
    offset += t.length;
    if (typeof lp.token_logprobs[i] !== "number" || lp.token_logprobs[i] > 0) {
      fail(`logprobs: token_logprobs[${i}] ${lp.token_logprobs[i]}`);
    }
    if (Object.keys(lp.top_logprobs[i] || {}).length !== 2) {
      fail(`logprobs: top_logprobs[${i}] ${show(lp.top_logprobs[i])}`);
    }
  });
});

await check("completions echo", async () => {
  if (!plain) return;
  const r = await client.completions.create({ ...sampling(plain), echo: true, logprobs: 1 });
  const c = r.choices[0];
  if (c.text !== plain.prompt + plain.text) {
    fail(`echo: text ${show(c.text)} != ${show(plain.prompt + plain.text)}`);
  }
  if (!c.logprobs || c.logprobs.token_logprobs[0] !== null) {
    fail(`echo: the first token_logprobs is not null: ${show(c.logprobs?.token_logprobs)}`);
  } else if (c.logprobs.tokens.join("") !== c.text) {
    fail(`echo: tokens ${show(c.logprobs.tokens)} do not join into the text`);
  }
});

await check("completions include_usage", async () => {
  if (!plain) return;
  const s = await client.completions.create({ ...sampling(plain), stream: true,
                                              stream_options: { include_usage: true } });
  const chunks = [];
  for await (const chunk of s) chunks.push(chunk);
  const last = chunks[chunks.length - 1];
  if (!last || last.choices.length !== 0 || !last.usage ||
      last.usage.completion_tokens !== plain.tokens.length) {
    fail(`include_usage: the last chunk ${show(last)}`);
  }
  const text = chunks.flatMap((k) => k.choices.map((c) => c.text)).join("");
  if (text !== plain.text) fail(`include_usage: text ${show(text)}`);
});

await check("completions penalties", async () => {
  const pen = expect.penalized;
  if (!pen) return fail("penalties: no jumbo generate expectation");
  const r = await client.completions.create({ ...sampling(pen),
    frequency_penalty: pen.frequency_penalty, presence_penalty: pen.presence_penalty });
  if (r.choices[0].text !== pen.text) {
    fail(`penalties: text ${show(r.choices[0].text)} != jumbo generate's ${show(pen.text)}`);
  }
});

const chatBody = chat && { model, messages: chat.messages, max_tokens: chat.max_tokens,
                           temperature: chat.temperature, seed: chat.seed };
await check("chat", async () => {
  if (!chat) return fail("chat: no expectation");
  const r = await client.chat.completions.create(chatBody);
  const c = r.choices[0];
  if (r.object !== "chat.completion" || c.message.role !== "assistant") {
    fail(`chat: ${show(r)}`);
  }
  if (c.message.content !== chat.content) {
    fail(`chat: content ${show(c.message.content)} != ${show(chat.content)}`);
  }
  if (c.finish_reason !== chat.finish_reason) fail(`chat: finish ${c.finish_reason}`);
  if (r.usage.total_tokens !== r.usage.prompt_tokens + r.usage.completion_tokens) {
    fail(`chat: usage ${show(r.usage)}`);
  }
});

await check("chat stream", async () => {
  if (!chat) return;
  const s = await client.chat.completions.create({ ...chatBody, stream: true,
                                                   stream_options: { include_usage: true } });
  let text = "";
  let role = null;
  let finish = null;
  let usage = null;
  for await (const chunk of s) {
    if (chunk.object !== "chat.completion.chunk") fail(`chat stream: chunk ${show(chunk)}`);
    for (const c of chunk.choices) {
      role = role ?? c.delta.role ?? null;
      text += c.delta.content ?? "";
      if (c.finish_reason) finish = c.finish_reason;
    }
    if (chunk.usage) usage = chunk.usage;
  }
  if (text !== chat.content) fail(`chat stream: content ${show(text)} != ${show(chat.content)}`);
  if (role !== "assistant" || finish !== chat.finish_reason || !usage) {
    fail(`chat stream: role ${role}, finish ${finish}, usage ${show(usage)}`);
  }
});

await check("chat logprobs", async () => {
  if (!chat) return;
  const r = await client.chat.completions.create({ ...chatBody, logprobs: true, top_logprobs: 2 });
  const content = r.choices[0].logprobs?.content;
  if (!Array.isArray(content) || content.length === 0) {
    return fail(`chat logprobs: ${show(r.choices[0].logprobs)}`);
  }
  for (const e of content) {
    if (typeof e.token !== "string" || typeof e.logprob !== "number" ||
        !Array.isArray(e.bytes) || e.top_logprobs.length !== 2) {
      return fail(`chat logprobs: entry ${show(e)}`);
    }
  }
});

await check("errors", async () => {
  const wrong = new OpenAI({ baseURL, apiKey: "sk-not-the-key", maxRetries: 0, timeout: 30000 });
  for (const [name, call] of [["models.list", () => wrong.models.list()],
                              ["completions.create",
                               () => wrong.completions.create({ model, prompt: "x", max_tokens: 1 })]]) {
    try {
      await call();
      fail(`a wrong key: ${name} succeeded`);
    } catch (e) {
      if (!(e instanceof sdk.AuthenticationError) || e.status !== 401 || e.code !== "invalid_api_key") {
        fail(`a wrong key: ${name} threw ${e?.constructor?.name} ${e?.status} ${e?.code}: ${e?.message}`);
      }
    }
  }
  try {
    await client.completions.create({ model: "no-such-model", prompt: "x", max_tokens: 1 });
    fail("an unknown model succeeded");
  } catch (e) {
    if (!(e instanceof sdk.NotFoundError) || e.code !== "model_not_found" || e.param !== "model") {
      fail(`an unknown model threw ${e?.constructor?.name} ${e?.status} ${e?.code} ${e?.param}`);
    }
  }
  try {
    await client.completions.create({ model, prompt: "x", max_tokens: 0 });
    fail("max_tokens 0 succeeded");
  } catch (e) {
    if (!(e instanceof sdk.BadRequestError) || e.param !== "max_tokens") {
      fail(`max_tokens 0 threw ${e?.constructor?.name} ${e?.status} ${e?.param}`);
    }
  }
});

console.log(`openai_sdk.mjs (openai ${sdkVersion}): ${failures ? `FAILED ${failures}` : "ok"}`);
process.exit(failures ? 1 : 0);
