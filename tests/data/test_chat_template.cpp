#include <gtest/gtest.h>

#include "data_test_support.h"
#include "jumbo/data/chat_template.h"

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

}  // namespace
}  // namespace jumbo
