#include "jumbo/model/checkpoint_names.h"

#include <fmt/format.h>

#include <cctype>
#include <tuple>

namespace jumbo {

bool model_tensor_before(const std::string& a, const std::string& b) {
  auto key = [](const std::string& n) {
    int group = 2;
    long long layer = -1;
    std::string rest = n;
    if (n.rfind("embedding.", 0) == 0) {
      group = 0;
    } else if (n.rfind("layers.", 0) == 0) {
      group = 1;
      size_t end = 7;
      while (end < n.size() && std::isdigit(static_cast<unsigned char>(n[end]))) ++end;
      if (end > 7 && end - 7 < 18) layer = std::stoll(n.substr(7, end - 7));
      rest = n.substr(end);
    }
    return std::make_tuple(group, layer, rest);
  };
  return key(a) < key(b);
}

std::vector<int64_t> model_tensor_real_shape(const ModelConfig& model, const std::string& name,
                                           const std::vector<int64_t>& stored,
                                           const std::string& where) {
  std::vector<int64_t> shape = stored;
  if ((name == kWordEmbedding || name == kUntiedHead) && !shape.empty()) {
    if (model.vocab <= 0 || model.vocab > shape[0]) {
      throw UserError(fmt::format("{}: {} has {} rows, fewer than model.vocab = {}", where, name,
                                  shape[0], model.vocab));
    }
    shape[0] = model.vocab;
  }
  return shape;
}

}  // namespace jumbo
