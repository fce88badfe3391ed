#pragma once
// Flags parsed once, by CLI11, with one kind of error: "--FLAG VALUE: expected WHAT", one line,
// exit 2 (main.cpp turns every CLI11 parse error into that line). Enum flags read the config's
// own table (parse_choice), so a flag and its config key accept the same names.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <optional>
#include <string>

#include "jumbo/config/config.h"

namespace jumbo::cli {

// The one-line error of a flag's value, thrown while parsing.
inline CLI::ValidationError flag_error(const std::string& flag, const std::string& value,
                                       const std::string& expected) {
  return CLI::ValidationError(fmt::format("{} {}: expected {}", flag, value, expected));
}

// A config enum's value named by a flag, or the flag's one-line error.
template <typename E>
E choice_of_flag(const std::string& flag, const std::string& text) {
  const std::optional<E> parsed = parse_choice<E>(text);
  if (!parsed) throw flag_error(flag, text, choice_names<E>());
  return *parsed;
}

// A flag that takes one of a config enum's names (--device cpu|cuda, --precision fp32|bf16).
template <typename E>
CLI::Option* add_choice_flag(CLI::App& cmd, const std::string& flag, E& value,
                             const std::string& help) {
  return cmd
      .add_option_function<std::string>(
          flag, [flag, &value](const std::string& text) { value = choice_of_flag<E>(flag, text); },
          help)
      ->default_str(to_string(value));
}

// As add_choice_flag, for a value that may stay unset (its default decided later).
template <typename E>
CLI::Option* add_choice_flag(CLI::App& cmd, const std::string& flag, std::optional<E>& value,
                             const std::string& help) {
  return cmd.add_option_function<std::string>(
      flag, [flag, &value](const std::string& text) { value = choice_of_flag<E>(flag, text); },
      help);
}

// A number flag with a lower bound (--batch >= 1): below it, "--batch 0: expected >= 1".
template <typename T>
CLI::Option* add_min_flag(CLI::App& cmd, const std::string& flag, T& value, T min,
                          const std::string& help) {
  return cmd
      .add_option_function<T>(
          flag,
          [flag, &value, min](const T& v) {
            if (v < min) throw flag_error(flag, fmt::format("{}", v), fmt::format(">= {}", min));
            value = v;
          },
          help)
      ->default_str(fmt::format("{}", value));
}

}  // namespace jumbo::cli
