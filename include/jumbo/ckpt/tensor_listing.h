#pragma once
// How the offline tools list a checkpoint's tensors. ckpt knows no model: the model's code
// says the order they are shown and exported in and each tensor's real shape, which may have
// fewer rows than stored (a padded vocabulary); model/checkpoint_names.h is jumbo's GPT's.
#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "jumbo/ckpt/manifest.h"
#include "jumbo/config/config.h"

namespace jumbo {

struct TensorListing {
  std::function<bool(const std::string& a, const std::string& b)> before;
  // The real shape of tensor `name`, stored as `stored` in a checkpoint of `model`: `stored`
  // with its first dimension cut, or as is. Throws UserError naming `where` when the
  // checkpoint cannot hold it.
  std::function<std::vector<int64_t>(const ModelConfig& model, const std::string& name,
                                     const std::vector<int64_t>& stored,
                                     const std::string& where)>
      real_shape;

  // The checkpoint's tensor names in this listing's order.
  std::vector<std::string> names_of(const Manifest& m) const {
    std::vector<std::string> names;
    for (const auto& [name, pieces] : m.tensors) names.push_back(name);
    std::sort(names.begin(), names.end(), before);
    return names;
  }
};

}  // namespace jumbo
