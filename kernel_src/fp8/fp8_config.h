// The FP8 producers' launch choices (fp8.cu): one block per row, the row held
// in registers as float32. Each rung says why.
#pragma once

#include <cstdint>

namespace ltx {
namespace fp8_config {

struct RowShape {
  int threads;  // per block (one row)
  int vpt;      // 16-byte words of x per thread
};

// Rows up to 2048 words (16384 bf16 elements). Widths of whole-row float32
// values per thread stay at <= 64 registers (vpt 8 of 8 bf16), so no rung spills.
inline RowShape row_shape(int64_t words) {
  // <= 1024 bf16 elements: 128 threads, one word each; up to 16 blocks per SM.
  if (words <= 128) return {128, 1};
  // 1536-2048 (Wan, LTX-Video hidden): 128 threads, 2 words: 4 KB of a row in flight per block.
  if (words <= 256) return {128, 2};
  // 3072-4096 (Flux, LTX-2 hidden): 128 threads of 4 words.
  if (words <= 512) return {128, 4};
  // 8192 (LTX-Video FF inner): 256 threads of 4 words.
  if (words <= 1024) return {256, 4};
  // 8960 (Wan FF inner, 1120 words): 384 threads of 3 words. 256 of 8 held 5 live words each at
  // 134 registers and ran at 41% of copy (H100, [2, 32760, 8960]).
  if (words <= 1152) return {384, 3};
  // up to 16384: 256 threads of 8 words.
  return {256, 8};
}

constexpr int64_t kMaxWords = 2048;

}  // namespace fp8_config
}  // namespace ltx
