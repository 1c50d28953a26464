// The VAE ops' launch choices (pixel_norm, inplace_add): the one place they are
// made. Each rung says why, with the same-run figure that chose it
// (docs/performance.md#vae).
#pragma once

#include <cstdint>

#include "../common/launch.cuh"

namespace ltx {
namespace vae_config {

// --- inplace_add ---------------------------------------------------------------------------------

constexpr int kAddBlock = 256;
// 16-byte words of x per thread: 1. Small blocks leave a short last wave (H200, same run, 4 -> 1
// word: [2,2688,2048] 17.52 -> 16.68 us, per channel [2,512,7,32,48] += [512,1,1,1] 14.78 -> 12.35;
// x.add_ 16.84, torch.compile 16.96 / 12.41). Development builds also compile 2 and 4 (A/B).
constexpr int kAddWordsPerThread = 1;
constexpr int64_t kAddMaxStridedBlocks = int64_t(1) << 20;  // then a grid stride

// --- pixel_norm ----------------------------------------------------------------------------------

// Shape limits of the vectorized kernel: a block of `pos_words` 16-byte words of positions x `groups`
// channel groups, each thread holding `words_per_thread` channel words of its position word.
constexpr int kMaxBlock = 1024;
constexpr int kMaxWordsPerThread = 8;  // registers: 8 x uint4 = 32 per thread
constexpr int kMinPosWords = 4;        // 64 contiguous bytes per channel plane and block
constexpr int kLinePosWords = 8;       // 128 bytes: a whole cache line per channel plane and block
constexpr int kMaxGroups = kMaxBlock / kMinPosWords;
constexpr int kScalarPositions = 32, kScalarGroups = 8;  // the scalar fallback's block

// The original rounding at 2 channel words per thread runs capped at 32 registers: its IEEE division
// (a slow-path call) takes it to 42 registers, 3 blocks per SM; capped it spills 40 bytes and is still
// faster (H200 [1,128,25,128,192] 179.96 -> 142.25 us). At 4 words the cap would spill 112 bytes.
constexpr bool register_capped(bool original_rounding, int words_per_thread) {
  return original_rounding && words_per_thread == 2;
}

struct PixelNormPlan {
  int pos_words = 0;
  int groups = 0;
  int words_per_thread = 0;
};

// A (pw, cpt) plan is usable when each position word's channels fit the block and the registers:
// groups = ceil(C / cpt) rounded up to whole warps. Zeroes when it does not fit.
inline PixelNormPlan make_plan(int64_t channels, int pw, int cpt) {
  const int64_t per_warp = 32 / pw;  // groups that share a warp
  const int64_t groups = ceil_div(ceil_div(channels, cpt), per_warp) * per_warp;
  if (pw * groups > kMaxBlock) return {};
  return {pw, int(groups), cpt};
}

inline bool is_pow2_in(int v, int lo, int hi) { return v >= lo && v <= hi && (v & (v - 1)) == 0; }

// The block plan for `channels` channels over `units` position words on a GPU of `sms` SMs (swept on
// the H100 and the H200, both roundings; one ladder serves both):
inline PixelNormPlan pixel_norm_plan(int64_t channels, int64_t units, int sms) {
  // Development builds: a forced (position words, channel words) plan, where it fits.
  const int forced_pw = tuning::override_of(tuning::Knob::kPixelNormPosWords);
  const int forced_cpt = tuning::override_of(tuning::Knob::kPixelNormChannelWords);
  if (is_pow2_in(forced_pw, kMinPosWords, 32) && is_pow2_in(forced_cpt, 1, kMaxWordsPerThread)) {
    const PixelNormPlan forced = make_plan(channels, forced_pw, forced_cpt);
    if (forced.pos_words != 0) return forced;
  }
  constexpr int64_t kMinGroups = 16, kMaxNarrowedBlock = 512, kTargetBlock = 256;
  // 8 channel words per thread, fewer when C < 128 (keeping >= 16 channel groups).
  int cpt = kMaxWordsPerThread;
  while (cpt > 1 && ceil_div(channels, cpt) < kMinGroups) cpt /= 2;
  const int64_t channel_groups = ceil_div(channels, cpt);
  // Blocks of about 256 threads (the original rounding's 128-thread blocks lost 10% on the H200 at
  // [1,128,25,128,192]), but whole 128-byte lines per channel plane even where that doubles the block
  // (H100 [2,512,7,32,48]: 4 words, 256 threads 18.14 us; 8 words, 512 threads 16.84).
  int pw = 32;
  while (pw > kLinePosWords && pw * channel_groups > kTargetBlock) pw /= 2;
  while (pw > kMinPosWords && pw * channel_groups > kMaxBlock) pw /= 2;
  // Fewer blocks than SMs: narrow the position words (down to 4, 64 bytes per channel plane), then
  // halve the channel words (down to 4, blocks of at most 512), so more threads share the few positions.
  while (pw > kMinPosWords && ceil_div(units, pw) < sms) pw /= 2;
  while (cpt > kMaxWordsPerThread / 2 && ceil_div(units, pw) < sms &&
         pw * ceil_div(channels, cpt / 2) <= kMaxNarrowedBlock) {
    cpt /= 2;
  }
  return make_plan(channels, pw, cpt);  // C <= 2048 always fits at pw = 4, cpt = 8
}

}  // namespace vae_config
}  // namespace ltx
