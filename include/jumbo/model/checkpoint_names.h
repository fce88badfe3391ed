#pragma once
// How GPT's tensors are named and listed in a checkpoint (the names are stage_params'),
// for the tools that list them; ckpt knows no model and takes these as a TensorListing.
#include <cstdint>
#include <string>
#include <vector>

#include "jumbo/config/config.h"

namespace jumbo {

// The tensors stored with padded rows: the vocabulary, padded to vocab_multiple x tp: the
// token embedding, and an untied model's output head.
inline constexpr const char* kWordEmbedding = "embedding.word";
inline constexpr const char* kUntiedHead = "head.weight";

// Model order: the embeddings, the layers by number (layers.2 before layers.10), the rest.
bool model_tensor_before(const std::string& a, const std::string& b);

// A tensor's real shape from its stored one: the word embedding and the head keep
// model.vocab rows.
// Throws UserError naming `where` when it has fewer.
std::vector<int64_t> model_tensor_real_shape(const ModelConfig& model, const std::string& name,
                                           const std::vector<int64_t>& stored,
                                           const std::string& where);

}  // namespace jumbo
