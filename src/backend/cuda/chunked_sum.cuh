#pragma once
// How the norms' weight gradients (layernorm.cu, qk_norm.cu) cut their N rows (or head
// instances) into chunks: each chunk's partial sums are written to scratch, then one finish
// kernel adds the chunks in order, so the sum is deterministic. At most kMaxChunks chunks of at
// least kMinPerChunk rows: enough blocks to fill a GPU, partials small next to the rows.
// Included inside each file's anonymous namespace, after <cstdint>.

constexpr int64_t kMinPerChunk = 64;
constexpr int64_t kMaxChunks = 256;

inline int64_t rows_per_chunk(int64_t rows) {
  const int64_t even = (rows + kMaxChunks - 1) / kMaxChunks;
  return even > kMinPerChunk ? even : kMinPerChunk;
}
inline int64_t chunk_count(int64_t rows) {
  return rows <= 0 ? 0 : (rows + rows_per_chunk(rows) - 1) / rows_per_chunk(rows);
}
