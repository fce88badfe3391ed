#pragma once
// How GPT's tensors are named and listed in a checkpoint (the names are gpt_stage_params'),
// for the tools that list them; ckpt knows no model and takes these as a TensorListing.
#include <cstdint>
#include <string>
#include <vector>

#include "jumbo/config/config.h"

namespace jumbo {

// The one tensor stored with padded rows: the vocabulary, padded to vocab_multiple x tp.
inline constexpr const char* kGptWordEmbedding = "embedding.word";

// Model order: the embeddings, the layers by number (layers.2 before layers.10), the rest.
bool gpt_tensor_before(const std::string& a, const std::string& b);

// A tensor's real shape from its stored one: the word embedding keeps model.vocab rows.
// Throws UserError naming `where` when it has fewer.
std::vector<int64_t> gpt_tensor_real_shape(const ModelConfig& model, const std::string& name,
                                           const std::vector<int64_t>& stored,
                                           const std::string& where);

}  // namespace jumbo
