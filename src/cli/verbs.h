#pragma once
// Each verb registers its subcommand and returns the function that runs it after parsing.
#include <CLI/CLI.hpp>

#include <functional>

namespace jumbo::cli {

using VerbRunner = std::function<int()>;

void add_train_verb(CLI::App& app, VerbRunner& run);
void add_info_verb(CLI::App& app, VerbRunner& run);
void add_data_verb(CLI::App& app, VerbRunner& run);
// `jumbo data tokenizer`, `jumbo data inspect-tokenizer` and `jumbo data tokenize`
// (verb_data_tokenizer.cpp).
void add_tokenizer_verbs(CLI::App& data, VerbRunner& run);
// `jumbo data render-chat` (verb_data_chat.cpp).
void add_chat_template_verbs(CLI::App& data, VerbRunner& run);
void add_bench_verb(CLI::App& app, VerbRunner& run);
void add_ckpt_verb(CLI::App& app, VerbRunner& run);
void add_plot_verb(CLI::App& app, VerbRunner& run);
void add_plan_verb(CLI::App& app, VerbRunner& run);
void add_doctor_verb(CLI::App& app, VerbRunner& run);
void add_generate_verb(CLI::App& app, VerbRunner& run);
void add_eval_verb(CLI::App& app, VerbRunner& run);
void add_serve_verb(CLI::App& app, VerbRunner& run);

}  // namespace jumbo::cli
