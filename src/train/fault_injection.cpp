#include "jumbo/train/fault_injection.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <thread>

#include "jumbo/config/config.h"

namespace jumbo {
namespace {

int64_t parse_count(const std::string& text, const std::string& entry) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos || text.size() > 18) {
    throw UserError(fmt::format("JUMBO_TEST_FAULT: \"{}\": \"{}\" is not a whole number >= 0; "
                                "expected nan@SAMPLE, spike@SAMPLE or slow@RANK:MS",
                                entry, text));
  }
  return std::stoll(text);
}

}  // namespace

FaultInjection FaultInjection::from_environment() {
  const char* text = std::getenv("JUMBO_TEST_FAULT");
  return text ? parse(text) : FaultInjection{};
}

FaultInjection FaultInjection::parse(const std::string& text) {
  FaultInjection f;
  std::stringstream in(text);
  std::string entry;
  while (std::getline(in, entry, ',')) {
    if (entry.empty()) continue;
    const size_t at = entry.find('@');
    const std::string kind = entry.substr(0, at), where = at == std::string::npos ? "" : entry.substr(at + 1);
    if (kind == "nan" && at != std::string::npos) {
      f.nan_samples_.push_back(parse_count(where, entry));
    } else if (kind == "spike" && at != std::string::npos) {
      f.spike_samples_.push_back(parse_count(where, entry));
    } else if (kind == "slow" && where.find(':') != std::string::npos) {
      const size_t colon = where.find(':');
      f.slow_.emplace_back(static_cast<int>(parse_count(where.substr(0, colon), entry)),
                           parse_count(where.substr(colon + 1), entry));
    } else {
      throw UserError(fmt::format("JUMBO_TEST_FAULT: \"{}\": expected nan@SAMPLE, spike@SAMPLE "
                                  "or slow@RANK:MS (comma-separated)", entry));
    }
  }
  return f;
}

bool FaultInjection::hits(const std::vector<int64_t>& samples, int64_t first, int64_t end) {
  return std::any_of(samples.begin(), samples.end(),
                     [&](int64_t s) { return s >= first && s < end; });
}

int64_t FaultInjection::slow_ms(int world_rank) const {
  int64_t ms = 0;
  for (const auto& [rank, extra] : slow_)
    if (rank == world_rank) ms += extra;
  return ms;
}

std::string FaultInjection::describe() const {
  if (empty()) return "";
  std::string out;
  for (int64_t s : nan_samples_) out += fmt::format("{}NaN gradients at sample {}", out.empty() ? "" : ", ", s);
  for (int64_t s : spike_samples_) out += fmt::format("{}scrambled targets at sample {}", out.empty() ? "" : ", ", s);
  for (const auto& [rank, ms] : slow_) out += fmt::format("{}rank {} slower by {} ms", out.empty() ? "" : ", ", rank, ms);
  return "test faults (JUMBO_TEST_FAULT): " + out;
}

void ScrambledTargets::next(const MicrobatchView& mb) {
  inner_.next(mb);
  const int64_t half = vocab_ / 2;
  for (int64_t i = 0; i < tokens_; ++i) {
    if (mb.targets[i] >= 0) mb.targets[i] = static_cast<int32_t>((mb.targets[i] + half) % vocab_);
  }
}

void poison_with_nan(Backend& backend, Tensor grads) {
  const float nan = NAN;
  backend.from_host(grads.rows(0, 1), &nan);
}

StepFaults::StepFaults(FaultInjection faults, Backend& backend, int world_rank, int64_t vocab,
                       int64_t tokens_per_microbatch)
    : faults_(std::move(faults)),
      backend_(backend),
      slow_ms_(faults_.slow_ms(world_rank)),
      vocab_(vocab),
      tokens_(tokens_per_microbatch) {}

MicrobatchSource& StepFaults::apply(StepRequest& request, MicrobatchSource& source,
                                    int64_t first, int64_t end) {
  if (faults_.nan_in(first, end)) {
    request.before_grad_norm = [this](Tensor grads) { poison_with_nan(backend_, grads); };
  }
  if (!faults_.spike_in(first, end)) return source;
  return scrambled_.emplace(source, vocab_, tokens_);
}

void StepFaults::slow_down() const {
  if (slow_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(slow_ms_));
}

}  // namespace jumbo
