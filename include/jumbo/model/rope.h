#pragma once
// RoPE's angles (Su et al. 2021) as Hugging Face's Llama computes them: inverse frequencies
// theta^(-2i/D) in fp32, Llama 3's scaling of the low frequencies (rope_scaling = llama3), and
// the table of cos and sin of position x frequency that backend.h's rope() reads.
#include <vector>

#include "jumbo/model/spec.h"

namespace jumbo {

// The D/2 inverse frequencies of a head of D = head_dim, scaled as the model's keys say.
std::vector<float> rope_inverse_frequencies(const ModelConfig& cfg);
// f32 [positions, head_dim]: row p holds cos(p f_i) for i < D/2, then sin(p f_i).
std::vector<float> rope_table(const ModelConfig& cfg, int64_t positions);

}  // namespace jumbo
