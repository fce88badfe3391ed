#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "data_test_support.h"
#include "jumbo/data/chat_template.h"
#include "jumbo/data/indexed_dataset.h"
#include "jumbo/data/jinja.h"
#include "jumbo/data/prepare.h"

namespace jumbo {
namespace {

const char* kTemplate = R"(
system = "<|system|>\n{content}\n"
user = "<|user|>\n{content}\n"
assistant = "<|assistant|>\n{content}<|end|>\n"
generation_prompt = "<|assistant|>\n"
stop = ["<|end|>"]
)";

TEST(ChatTemplate, RendersEachRoleThenTheGenerationPrompt) {
  const ChatTemplate t = parse_chat_template(kTemplate, "chat.toml");
  const std::vector<ChatMessage> messages = {{ChatRole::system, "Be brief."},
                                             {ChatRole::user, "Hi {content}"},
                                             {ChatRole::assistant, "Hello."},
                                             {ChatRole::user, "Why?"}};
  EXPECT_EQ(t.render(messages, true),
            "<|system|>\nBe brief.\n<|user|>\nHi {content}\n<|assistant|>\nHello.<|end|>\n"
            "<|user|>\nWhy?\n<|assistant|>\n");
  EXPECT_EQ(t.render({{ChatRole::user, "x"}}, false), "<|user|>\nx\n");
  EXPECT_EQ(t.stop, std::vector<std::string>{"<|end|>"});
  EXPECT_TRUE(t.has_role(ChatRole::system));
}

TEST(ChatTemplate, TheShippedTemplateLoads) {
  const ChatTemplate t = load_chat_template(test::source_path("inputs/chat/jumbo-chat.toml"));
  EXPECT_EQ(t.render({{ChatRole::user, "Hi"}}, true), "<|user|>\nHi\n<|assistant|>\n");
  EXPECT_FALSE(t.stop.empty());
}

TEST(ChatTemplate, WithoutASystemFormatHasNoSystemRole) {
  const ChatTemplate t = parse_chat_template("user = \"U: {content}\\n\"\nassistant = \"A: {content}\\n\"\n",
                                             "c.toml");
  EXPECT_FALSE(t.has_role(ChatRole::system));
  EXPECT_TRUE(t.generation_prompt.empty());
}

TEST(ChatTemplate, BadFilesNameTheKey) {
  auto error = [](const std::string& text) {
    return test::user_error_of([&] { parse_chat_template(text, "c.toml"); });
  };
  EXPECT_NE(error("assistant = \"{content}\"").find("c.toml: user: missing"), std::string::npos);
  EXPECT_NE(error("user = \"no slot\"\nassistant = \"{content}\"").find("user"), std::string::npos);
  EXPECT_NE(error("user = \"{content}{content}\"\nassistant = \"{content}\"").find("exactly once"),
            std::string::npos);
  EXPECT_NE(error("user = \"{content}\"\nassistant = \"{content}\"\nsystm = \"{content}\"")
                .find("systm: unknown key"), std::string::npos);
  EXPECT_NE(error("user = \"{content}\"\nassistant = \"{content}\"\nstop = \"x\"").find("stop"),
            std::string::npos);
  EXPECT_NE(error("user = ").find("c.toml:1"), std::string::npos);
  EXPECT_NE(test::user_error_of([] { load_chat_template("/nonexistent/chat.toml"); })
                .find("/nonexistent/chat.toml"), std::string::npos);
}

std::string hf_config(const std::string& model) {
  return test::source_path("tests/data/chat_templates/" + model + "/tokenizer_config.json");
}

TEST(ChatTemplate, HuggingFaceTemplatesRenderAsTransformersDoes) {
  const ChatTemplate llama = load_chat_template(hf_config("Llama-3.1-8B-Instruct"));
  EXPECT_EQ(llama.kind, ChatTemplateKind::jinja);
  EXPECT_TRUE(llama.has_role(ChatRole::system));
  EXPECT_EQ(llama.render({{ChatRole::system, " Be brief. "}, {ChatRole::user, "Hi"}}, true),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: "
            "December 2023\nToday Date: 26 Jul 2024\n\nBe brief.<|eot_id|><|start_header_id|>user"
            "<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(llama.stop, (std::vector<std::string>{"<|eot_id|>", "<|eom_id|>"}));

  const ChatTemplate qwen = load_chat_template(hf_config("Qwen2.5-7B-Instruct"));
  EXPECT_FALSE(qwen.bos_token.has_value());
  EXPECT_EQ(qwen.render({{ChatRole::user, "Hi"}}, true),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
            "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(qwen.stop, std::vector<std::string>{"<|im_end|>"});

  const ChatTemplate mistral = load_chat_template(hf_config("Mistral-7B-Instruct-v0.3"));
  EXPECT_EQ(mistral.render({{ChatRole::user, "Hi"}, {ChatRole::assistant, " Hello. "}}, false),
            "<s>[INST] Hi[/INST] Hello.</s>");
  try {
    mistral.render({{ChatRole::user, "a"}, {ChatRole::user, "b"}}, true);
    FAIL() << "two user messages in a row";
  } catch (const jinja::RaisedException& e) {
    EXPECT_STREQ(e.what(), "After the optional system message, conversation roles must alternate "
                           "user/assistant/user/assistant/...");
  }
}

TEST(ChatTemplate, JinjaTrainingExamplesAreTheWholeLessThePrompt) {
  const ChatTemplate qwen = load_chat_template(hf_config("Qwen2.5-7B-Instruct"));
  std::string prompt, completion;
  ASSERT_EQ(qwen.training_example({{ChatRole::user, "Hi"}, {ChatRole::assistant, "Hello."}}, prompt, completion), "");
  EXPECT_TRUE(prompt.ends_with("<|im_start|>assistant\n"));
  EXPECT_EQ(completion, "Hello.<|im_end|>\n");
  // Mistral's template puts the system message into the last user turn only: the prompt is
  // then not a prefix of the whole conversation, which is refused in one line.
  const ChatTemplate mistral = load_chat_template(hf_config("Mistral-7B-Instruct-v0.3"));
  ASSERT_EQ(mistral.training_example({{ChatRole::user, "Hi"}, {ChatRole::assistant, "Yo"}}, prompt, completion), "");
  EXPECT_EQ(completion, " Yo</s>");
  const std::string why = mistral.training_example(
      {{ChatRole::system, "S"}, {ChatRole::user, "Hi"}, {ChatRole::assistant, "Yo"}}, prompt, completion);
  EXPECT_NE(why.find("without starting with its prompt"), std::string::npos) << why;
  EXPECT_EQ(why.find('\n'), std::string::npos);
  // raise_exception: the template's message.
  EXPECT_NE(mistral.training_example({{ChatRole::assistant, "A"}, {ChatRole::assistant, "B"}}, prompt, completion)
                .find("conversation roles must alternate"), std::string::npos);
}

TEST(ChatTemplate, StoredTextRoundTripsBothKinds) {
  for (const std::string& path : {hf_config("Llama-3.2-3B-Instruct"), test::source_path("inputs/chat/jumbo-chat.toml")}) {
    const ChatTemplate a = load_chat_template(path);
    const ChatTemplate b = parse_stored_chat_template(a.text, "ckpt (data.chat_template)");
    EXPECT_EQ(a.kind, b.kind) << path;
    EXPECT_EQ(a.text, b.text) << path;
    EXPECT_EQ(a.stop, b.stop) << path;
    const std::vector<ChatMessage> m = {{ChatRole::user, "x"}, {ChatRole::assistant, "y"}};
    EXPECT_EQ(a.render(m, false), b.render(m, false)) << path;
  }
}

TEST(ChatTemplate, JinjaFilesTakeTheSpecialTokensBesideThem) {
  test::TempDir tmp;
  {
    std::ofstream(tmp.file("tokenizer_config.json")) << R"({"bos_token": {"content": "<B>"}, "eos_token": "<E>"})";
    std::ofstream(tmp.file("chat.jinja")) << "{{ bos_token }}{% for m in messages %}{{ m.role }}:{{ m.content }}"
                                             "{{ eos_token }}{% endfor %}\n";
    std::ofstream(tmp.file("list.json")) << R"({"chat_template": [{"name": "tool_use", "template": "T"},
                                                                   {"name": "default", "template": "D{{ 1 }}"}]})";
    std::ofstream(tmp.file("none.json")) << R"({"eos_token": "</s>"})";
    std::ofstream(tmp.file("bad.json")) << R"({"chat_template": "{% if x %}never closed"})";
  }
  const ChatTemplate t = load_chat_template(tmp.file("chat.jinja"));
  EXPECT_EQ(t.render({{ChatRole::user, "hi"}}, false), "<B>user:hi<E>");
  EXPECT_EQ(t.stop, std::vector<std::string>{"<E>"});
  EXPECT_EQ(load_chat_template(tmp.file("list.json")).render({}, false), "D1");
  EXPECT_NE(test::user_error_of([&] { load_chat_template(tmp.file("none.json")); }).find("no chat_template"),
            std::string::npos);
  const std::string bad = test::user_error_of([&] { load_chat_template(tmp.file("bad.json")); });
  EXPECT_NE(bad.find("bad.json:1: expected \"{% elif %}\""), std::string::npos) << bad;
}

// data prepare --chat-template tokenizer_config.json: {"messages"} lines become the same
// examples as the {"prompt", "completion"} lines of the texts the template renders.
TEST(ChatTemplate, PrepareMakesExamplesThroughAHuggingFaceTemplate) {
  test::TempDir tmp;
  const std::string config = hf_config("Qwen2.5-7B-Instruct");
  const ChatTemplate qwen = load_chat_template(config);
  const std::vector<std::vector<ChatMessage>> conversations = {
      {{ChatRole::user, "Name the genre."}, {ChatRole::assistant, "reportage"}},
      {{ChatRole::system, "Be brief."}, {ChatRole::user, "Hi"}, {ChatRole::assistant, "Hello."},
       {ChatRole::user, "More?"}, {ChatRole::assistant, "No."}}};
  {
    std::ofstream chat(tmp.file("chat.jsonl")), pc(tmp.file("pc.jsonl"));
    for (const auto& c : conversations) {
      nlohmann::json messages = nlohmann::json::array();
      for (const ChatMessage& m : c) {
        const char* role = m.role == ChatRole::system ? "system" : m.role == ChatRole::user ? "user" : "assistant";
        messages.push_back({{"role", role}, {"content", m.content}});
      }
      chat << nlohmann::json{{"messages", messages}}.dump() << "\n";
      std::string prompt, completion;
      ASSERT_EQ(qwen.training_example(c, prompt, completion), "");
      pc << nlohmann::json{{"prompt", prompt}, {"completion", completion}}.dump() << "\n";
    }
  }
  auto prepare = [&](const std::string& in, const std::string& chat_template) {
    PrepareOptions o;
    o.inputs = {tmp.file(in + ".jsonl")};
    o.tokenizer = test::small_tokenizer();
    o.output_prefix = tmp.file(in);
    o.kind = DocumentKind::prompt_completion;
    o.chat_template = chat_template;
    o.progress_every_s = 0;
    prepare_dataset(o);
  };
  prepare("chat", config);
  prepare("pc", "");
  test::expect_same_examples(tmp.file("chat"), tmp.file("pc"), 2);
}

}  // namespace
}  // namespace jumbo
