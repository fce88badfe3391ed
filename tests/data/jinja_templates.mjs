// tests/data/jinja_templates.sh's node side: conversations (seeded), @huggingface/jinja's
// rendering of them, and the comparison with jumbo's, line by line.
//   node jinja_templates.mjs gen SEED N OUT.jsonl [alternating|violating]
//   node jinja_templates.mjs render PACKAGE_INDEX_JS TOKENIZER_CONFIG IN.jsonl GEN(0|1) OUT.jsonl
//   node jinja_templates.mjs compare REFERENCE.jsonl JUMBO.jsonl LABEL
import fs from "fs";

const [mode, ...args] = process.argv.slice(2);

function rng(seed) {  // mulberry32
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const PIECES = [
  "Hello", "What's the weather in Paris?", " leading space", "trailing space ", "  both  ",
  "two\nlines", "\nnewline first", "newline last\n", "tab\there", "quotes: \" and '", "braces {{ x }} {% if %} {# c #}",
  "unicode: é ü ñ 日本語 Ελληνικά 🎉", "\u00a0nbsp\u3000ideographic space", "back\\slash", "<s> </s> [INST] <|eot_id|>",
  "", "42", "json {\"a\": [1, 2]}", "    indented code\n        more", "emoji 👩‍💻 done",
];

function content(r) {
  const n = 1 + Math.floor(r() * 3);
  let s = "";
  for (let k = 0; k < n; ++k) s += (k ? (r() < 0.5 ? " " : "\n") : "") + PIECES[Math.floor(r() * PIECES.length)];
  return s;
}

if (mode === "gen") {
  const [seed, n, out, kind = "alternating"] = args;
  const r = rng(Number(seed));
  const lines = [];
  for (let i = 0; i < Number(n); ++i) {
    const messages = [];
    if (r() < 0.5) messages.push({ role: "system", content: content(r) });
    const turns = 1 + Math.floor(r() * 6);
    for (let k = 0; k < turns; ++k) messages.push({ role: k % 2 === 0 ? "user" : "assistant", content: content(r) });
    if (kind === "violating") {  // two messages of one role in a row somewhere after the system
      const at = messages.findIndex((m) => m.role !== "system");
      messages.splice(at + Math.floor(r() * (messages.length - at)), 0, { role: r() < 0.5 ? "user" : "assistant", content: content(r) });
      const rest = messages.filter((m) => m.role !== "system");
      if (!rest.some((m, k) => (m.role === "user") !== (k % 2 === 0))) rest.unshift(rest[0]);
      messages.splice(0, messages.length, ...messages.filter((m) => m.role === "system"), ...rest);
    }
    lines.push(JSON.stringify({ messages }));
  }
  fs.writeFileSync(out, lines.join("\n") + "\n");
} else if (mode === "render") {
  const [pkg, configPath, input, gen, out] = args;
  const { Template } = await import(pkg);
  const config = JSON.parse(fs.readFileSync(configPath, "utf8"));
  let text = config.chat_template;
  if (Array.isArray(text)) text = text.find((t) => t.name === "default").template;
  const template = new Template(text);
  const token = (t) => (t && typeof t === "object" ? t.content : t);
  const lines = [];
  for (const line of fs.readFileSync(input, "utf8").split("\n")) {
    if (!line.trim()) continue;
    const vars = { messages: JSON.parse(line).messages, add_generation_prompt: gen === "1" };
    if (token(config.bos_token) != null) vars.bos_token = token(config.bos_token);
    if (token(config.eos_token) != null) vars.eos_token = token(config.eos_token);
    try {
      lines.push(JSON.stringify({ text: template.render(vars) }));
    } catch (e) {
      lines.push(JSON.stringify({ error: e.message }));
    }
  }
  fs.writeFileSync(out, lines.join("\n") + "\n");
} else if (mode === "compare") {
  const [refPath, gotPath, label] = args;
  const ref = fs.readFileSync(refPath, "utf8").trim().split("\n").map((l) => JSON.parse(l));
  const got = fs.readFileSync(gotPath, "utf8").trim().split("\n").map((l) => JSON.parse(l));
  let bad = 0, errors = 0;
  if (ref.length !== got.length) {
    console.log(`${label}: ${got.length} lines from jumbo, ${ref.length} from @huggingface/jinja`);
    process.exit(1);
  }
  for (let i = 0; i < ref.length; ++i) {
    const same = ref[i].text !== undefined ? got[i].text === ref[i].text : got[i].error === ref[i].error;
    if (ref[i].error !== undefined) ++errors;
    if (!same) {
      if (++bad <= 3) {
        console.log(`${label}: conversation ${i + 1} differs`);
        console.log(`  @huggingface/jinja: ${JSON.stringify(ref[i])}`);
        console.log(`  jumbo:              ${JSON.stringify(got[i])}`);
      }
    }
  }
  console.log(`${label}: ${ref.length - bad}/${ref.length} identical (${errors} refused by raise_exception)`);
  process.exit(bad ? 1 : 0);
}
