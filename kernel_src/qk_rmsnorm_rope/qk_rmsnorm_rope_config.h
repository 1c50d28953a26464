// qk_rmsnorm_rope's launch choices: the one place they are made. Each rung says
// why, with the same-run figure that chose it (H200 unless named;
// docs/performance.md#qk_rmsnorm_rope). No choice differs by GPU class: the
// grid plan was measured on both GPUs and won on both, the rest on the H200
// (with the H100 agreeing where it was measured too).
#pragma once

#include <cstdint>

#include "../common/column_sum.cuh"
#include "../common/launch.cuh"
#include "../common/tuning.h"
#include "qk_rmsnorm_rope.h"

namespace ltx {
namespace qk_rmsnorm_rope_config {

// The general (vectorized) kernel's block: 256 threads, whose register budgets
// (min_blocks_per_sm) are counted in these blocks.
constexpr int kBlock = 256;
// Whole-row norms of 257-512 words: one word per thread in a block of 512 (a
// token per block), not two words per thread in 256 (LTX 13B's [2,2688,4096]:
// 78.94 -> 75.97 us; H100 94.77 -> 92.69).
constexpr int kWideBlock = 512;
// The one-word per-head kernel's block: 256 threads, 4 blocks per SM in its
// ~62 registers (5 blocks in 48 registers spilled and ran 17% slower).
constexpr int kHeadBlock = 256;
// Words per thread the general kernel is compiled for; longer rows take the
// scalar fallback.
constexpr int kMaxVpt = 4;

// The fast path's launch shape: threads per row and words per thread, or
// (tokens_per_block > 0) the one-word per-head kernel's block: tokens per
// block, threads, and chunks a row is split into (blocks along y).
struct Plan {
  bool vectorized = false;
  int tpr = 0, vpt = 0, group_words = 0;  // group_words 0: the norm group is the whole row
  int tokens_per_block = 0, block = 0, chunks = 1;
  bool head_word_pairs = false;  // the one-word kernel at two words of q and two of k per thread
  bool row_tables = false;       // the row-tables kernel (plan_row_tables); tpr and vpt are its width
  bool one_table_word = false;   // the general kernel at one table word a thread (plan_row_tables)
};

inline bool rows_aligned(const void* p, int64_t batch_stride, int64_t seq_stride, int64_t elems_per_word) {
  return is_aligned16(p) && batch_stride % elems_per_word == 0 && seq_stride % elems_per_word == 0;
}

// The one-word kernel's block for rows of `words` 16-byte words: whole tokens
// when a row fits kHeadBlock threads (rounded up to whole warps), else the
// widest chunk of whole warps (so whole heads) that divides the row; false when
// none does (e.g. 33 heads of 64: 264 words), and the general kernel takes it.
inline bool plan_head_words(int64_t words, Plan& plan) {
  if (words <= kHeadBlock) {
    plan.tokens_per_block = int(kHeadBlock / words);
    plan.block = int(ceil_div(plan.tokens_per_block * words, int64_t(32)) * 32);
    return true;
  }
  for (int chunk = kHeadBlock; chunk >= 32; chunk -= 32) {
    if (words % chunk == 0 && words / chunk <= 65535) {
      plan.tokens_per_block = 1;
      plan.block = chunk;
      plan.chunks = int(words / chunk);
      return true;
    }
  }
  return false;
}

// Threads per row the general kernel can take: up to kBlock, any leaving
// <= kMaxVpt words per thread; kWideBlock, whole-row norms of one word per thread.
inline bool tpr_fits(int tpr, int64_t words, bool head_groups) {
  if (tpr <= kBlock) return ceil_div(words, tpr) <= kMaxVpt;
  return tpr == kWideBlock && !head_groups && words <= tpr;
}

// Samples a pass of the general kernel takes: two when the norm is over the
// whole row (a block-wide reduction: one round then serves four rows), the
// batch has two or more and the tables are shared by it (one table read serves
// both): [2,2688,2048] 41.1 -> 38.9 us, [2,2688,4096] 89.5 -> 80.4 (then at two
// words per thread in 256, before kWideBlock), [2,15360,2048] 213.0 -> 198.5. Else one:
// per-head norms reduce with shuffles alone and lost with two ([2,2688,32,128]
// 65 -> 81 us).
inline int samples_per_pass(const QkRmsnormRopeArgs& a, const Plan& plan) {
  // Development builds: samples 1 forces one.
  if (tuning::override_of(tuning::Knob::kQkSamples) == 1) return 1;
  const bool shared_tables = a.cos.batch_stride == 0 && a.sin.batch_stride == 0;
  return plan.group_words == 0 && a.batch >= 2 && shared_tables ? 2 : 1;
}

// Whole-row norms whose tables repeat along the row (Wan: one head's 128 columns under the norm over all
// heads). With threads per row a multiple of the tables' words, every word of a thread is in one table
// column: one table word a thread, not one per word. H200 harnesses (experiments/qk_wan_rows, branch
// exp/bwd-reduction-phase), Wan's form at batch 1, us at 1.3B's [1, 32760, 1536] / 14B's [1, 32760, 5120]
// (copy of q and k 97.9 / 317.6):
//   - the general kernel (a block per token group, runtime rounding flags), a table word per row word:
//     64 x 3 172.1, 256 x 3 657.2; one table word: 163.8, 615.7 (same bits); at its best widths (32 x 6,
//     128 x 5) 156.6, 468.0; with the rounding compiled in (LTX-Video's chain) 135.0, 397.0.
//   - the row-tables kernel (below): persistent, the next row's words loaded before this one's are
//     reduced, the rounding compiled in: 64 x 3 110.3 (89% of copy), 160 x 4 348.5 (91%); 96 x 2 111.5,
//     192 x 1 113.1, 32 x 6 124.5 (163 registers); 256 x 3 354.7, 128 x 5 359.8. Runtime flags instead
//     of the compiled rounding: 125.6, 384.0.
// Its widths (threads x words = the row's 16-byte words; each compiled): Wan 1.3B's 1536, 2.2 5B's 3072
// and 14B's 5120 in bf16/fp16 (3072 at 128 x 3, three words as 1536's: in the release bench only, 179.2 us,
// 92% of copy), at any batch (timed at batch 1). Other widths with repeating tables take the general kernel
// at one table word, the fewest threads with at most kRowTablesMaxVpt words, at one sample a pass (two
// samples keep the general plan).
constexpr int kRowTablesThreads[] = {64, 128, 160};
__host__ __device__ constexpr int row_tables_vpt(int tpr) { return tpr == 160 ? 4 : 3; }
// Its block: two rows of 64 threads, else one row; held to 512 threads an SM (<= 128 registers; 160 x 4
// took 123 at 3 blocks of 160).
template <int TPR> __host__ __device__ constexpr int row_tables_block() { return TPR < 128 ? 128 : TPR; }
template <int TPR> __host__ __device__ constexpr int row_tables_min_blocks() { return 512 / row_tables_block<TPR>(); }
constexpr int kRowTablesMaxVpt = 6;
inline bool plan_row_tables(const QkRmsnormRopeArgs& a, int64_t words, int forced_tpr, Plan& plan) {
  const int64_t table_words = a.table_dim / (16 / dtype_size(a.dtype));
  if (forced_tpr != tuning::kUnset || plan.group_words != 0 || a.table_dim == a.dim ||
      (table_words & (table_words - 1)) != 0)
    return false;
  if (a.batch * a.seq < (int64_t(1) << 31)) {  // the kernel's 32-bit row counters
    for (const int tpr : kRowTablesThreads) {
      if (int64_t(tpr) * row_tables_vpt(tpr) == words && tpr % table_words == 0) {
        plan.vectorized = plan.row_tables = true;
        plan.tpr = tpr;
        plan.vpt = row_tables_vpt(tpr);
        return true;
      }
    }
  }
  if (samples_per_pass(a, plan) != 1) return false;
  for (int64_t tpr = table_words; tpr <= kBlock; tpr *= 2) {
    if (ceil_div(words, tpr) <= kRowTablesMaxVpt) {
      plan.vectorized = plan.one_table_word = true;
      plan.tpr = int(tpr);
      plan.vpt = int(ceil_div(words, tpr));
      return true;
    }
  }
  return false;
}

inline Plan plan_for(const QkRmsnormRopeArgs& a) {
  Plan plan;
  const int64_t n = 16 / dtype_size(a.dtype);
  if (a.dim % n || a.head_dim % n || a.table_dim % n) return plan;
  for (const QkOperand* o : {&a.q, &a.k}) {
    if (!rows_aligned(o->in, o->in_batch_stride, o->in_seq_stride, n) ||
        !rows_aligned(o->out, o->out_batch_stride, o->out_seq_stride, n))
      return plan;
    if (o->weight && !is_aligned16(o->weight)) return plan;
  }
  for (const QkTable* t : {&a.cos, &a.sin})
    if (!rows_aligned(t->ptr, t->batch_stride, t->seq_stride, 4)) return plan;
  const int64_t words = a.dim / n, head_words = a.head_dim / n;
  const bool head_groups = head_words <= 32 && (head_words & (head_words - 1)) == 0;
  if (head_groups) {
    plan.group_words = int(head_words);
    if (a.rotation == Rotation::kHalf && head_words < 2) return plan;  // partner inside the same word
  } else if (a.head_dim != a.dim || a.rotation == Rotation::kHalf) {
    return plan;
  }
  // Development builds: threads_per_row (any value) forces the general kernel at that width.
  const int forced_tpr = tuning::override_of(tuning::Knob::kQkThreadsPerRow);
  // Per-head norms of 2-byte types: the one-word kernel (v7), not the general
  // one (v6: [2,2688,32,128] 66.4 -> 60.3 us, Flux [1,4608,24,128] 56.5 -> 44.7).
  // Development builds: one_word 0 (or a threads_per_row) keeps them on v6.
  if (head_groups && n == 8 && forced_tpr == tuning::kUnset &&
      tuning::override_of(tuning::Knob::kQkOneWord) != 0) {
    // Two words per thread where they are the same lane of two heads (tables
    // per head: [2,2688,32,128] 58.3 -> 56.6 us, Flux 42.4 -> 39.0; H100 67.5 ->
    // 64.1, 46.5 -> 44.4; four, at 2 blocks per SM, 69.2 / 55.8).
    // Development builds: head_words 1 forces one.
    const bool pairs = tuning::override_of(tuning::Knob::kQkHeadWords) != 1 && a.table_dim == a.head_dim &&
                       words % 2 == 0 && (words / 2) % head_words == 0;
    plan.head_word_pairs = pairs && plan_head_words(words / 2, plan);
    if (plan.head_word_pairs || plan_head_words(words, plan)) {
      plan.vectorized = true;
      return plan;
    }
  }
  if (plan_row_tables(a, words, forced_tpr, plan)) return plan;
  // Fewest thread slots (tpr * vpt >= words), ties to the fewest words per
  // thread (fewer registers, more rows in flight per SM: at LTX's 256 words
  // tpr 256 took 44 us, tpr 128 54 us); tpr a power of two covering a head.
  int64_t best_slots = -1;
  const int min_tpr = head_groups ? int(head_words) : 1;
  if (forced_tpr != tuning::kUnset) {
    const int tpr = forced_tpr;
    if (tpr >= min_tpr && (tpr & (tpr - 1)) == 0 && tpr_fits(tpr, words, head_groups)) {
      plan.tpr = tpr;
      plan.vpt = int(ceil_div(words, tpr));
      plan.vectorized = true;
      return plan;
    }
  }
  for (int tpr = min_tpr; tpr <= kWideBlock; tpr *= 2) {
    const int64_t vpt = ceil_div(words, tpr);
    if (!tpr_fits(tpr, words, head_groups)) continue;
    const int64_t slots = tpr * vpt;
    if (best_slots < 0 || slots < best_slots || (slots == best_slots && vpt < plan.vpt)) {
      best_slots = slots;
      plan.tpr = tpr;
      plan.vpt = int(vpt);
    }
  }
  plan.vectorized = best_slots > 0;
  return plan;
}

// The general kernel's grid: one block per token group, not persistent (a
// block carries nothing from one token to the next, and the hardware balances
// the load: [2,15360,2048] 198.8 -> 192.3 us; H100 282.3 -> 251.6).
constexpr GridPlan kVectorizedGrid = GridPlan::kOnePerBlock;

// The one-word kernel's grid: one block per token group (x) and row chunk (y),
// not persistent, for the same reason (a persistent grid with bulk copies 4
// tokens ahead, ~3x the bytes in flight, was no faster: 56.0 -> 56.4 us).
inline dim3 head_words_grid(int64_t seq, const Plan& plan) {
  return dim3(unsigned(ceil_div(seq, int64_t(plan.tokens_per_block))), unsigned(plan.chunks));
}

// The scalar fallback's grid (any size or alignment; not tuned): persistent,
// each warp walking norm groups with a grid stride.
constexpr GridPlan kScalarGrid = GridPlan::kPersistent;

// The general kernel's instantiations that plan_for picks only under an
// override: release builds do not compile them (their launch is unreachable).
//  - Two words per thread at two samples per pass, so over a whole row: a tie
//    of thread slots goes to fewer words per thread, and one word in twice the
//    threads always ties (up to kWideBlock: whole rows only); threads_per_row
//    brings it (LTX 13B's 4096 at 256).
//  - One word per thread with per-head tables on 2-byte types: such rows are at
//    most kBlock words, which the one-word kernel always takes; one_word 0 or
//    threads_per_row brings it.
// All others have release shapes: e.g. 2-byte per-head rows the one-word kernel
// cannot chunk (33 heads of 64: 264 words) take the general kernel at 2-4 words
// per thread, and one word without per-head tables is any short whole row
// that is not on LTX's chain.
template <int kElemBytes, int VPT, bool kHeadTables, int S> constexpr bool override_only() {
  static_assert(kWideBlock == 2 * kBlock && kHeadBlock >= kBlock, "the ties and the fit above");
  return (VPT == 2 && S == 2) || (kElemBytes == 2 && VPT == 1 && kHeadTables);
}

// --- backward (qk_rmsnorm_rope_bwd.cu). Timed as shipped (results/qk_rmsnorm_rope-backward-H100-80GB-HBM3.json:
// 60% of copy at LTX's rows, 75% at Wan's); no rung below was chosen by a sweep. --------------------------

// Threads of a backward block: 8 warps (not swept).
constexpr int kBwdThreads = 256;

// Pairs of a norm group each thread holds in the block-per-worker backward: groups of 512 to 4096
// channels (LTX-Video's rows of 2048: 4 pairs, Wan's 1536: 3) take it, with x, dy and the dw sums in
// registers and 256 threads on one group; smaller groups (heads of 64-256) take a warp per worker, as
// a block would leave most threads idle (not swept).
constexpr int kBwdMaxPairsPerThread = 8;
// Runs of units the warp kernel's units are cut into, each split over up to column_sum's 1024
// workers: one run per `full_run` units (1024 workers of the minimum 8 units), at most 8 runs, ~8K
// warps (~62 per SM on 132 SMs): one run would leave ~8 warps per SM at Flux's [1, 4608, 24, 128]
// (not swept). A function of the sizes alone, so the sums' order is too.
constexpr int64_t kBwdMaxUnitGroups = 8;
inline int64_t bwd_unit_groups(int64_t units, int64_t full_run) {
  const int64_t runs = units / full_run;
  return runs < 1 ? 1 : runs > kBwdMaxUnitGroups ? kBwdMaxUnitGroups : runs;
}

// Whole-row norms (LTX-Video's 2048, Wan's 1536, LTX 13B's 4096) with the interleaved rotation, aligned
// rows and per-channel tables take the row kernel: 16-byte words of x, dy and the tables, q and k of a
// token in one pass. (The block kernel above it, 2-byte loads and table columns by 64-bit modulo, 4 pairs
// per thread, took 211 us at LTX's [2,2688,2048], 20% of copy, and 1660 us at Wan's [2,32760,1536], 23%:
// H200.)
constexpr int kBwdMaxRowThreads = 512;
constexpr int kBwdMaxRowWordsPerThread = 4;
// Threads of a row-kernel block of more than one word per thread: its registers (x, dy and table words
// of q and k, twice with the prefetch, and the dw sums) exceed the 128 a 512-thread block allows.
constexpr int kBwdMaxMultiWordThreads = 256;

inline bool bwd_row_threads_fit(int threads, int64_t words) {
  if (threads <= 0 || threads % 32 || threads > kBwdMaxRowThreads) return false;
  const int64_t vpt = ceil_div(words, int64_t(threads));
  return vpt == 1 || (vpt <= kBwdMaxRowWordsPerThread && threads <= kBwdMaxMultiWordThreads);
}

// Threads per row of the row kernel for rows of `words` 16-byte words; 0: the block kernel. One word
// per thread up to 512 words, in whole warps (Wan's 192 words: 192 threads; LTX 13B's 512: 512, as the
// forward's kWideBlock), else the fewest words per thread in up to 256 threads (not swept; the
// rmsnorm backward's lessons: 256 x 1 best at 2048, 96 x 2 at 1536 there). Development builds:
// bwd_threads T forces T where it fits (bwd_row_threads_fit); 0 forces the block kernel.
inline int bwd_row_threads(int64_t words) {
  if (words <= 0 || words > int64_t(kBwdMaxMultiWordThreads) * kBwdMaxRowWordsPerThread) return 0;
  const int forced = tuning::override_of(tuning::Knob::kQkBwdThreads);
  if (forced == 0) return 0;
  if (bwd_row_threads_fit(forced, words)) return forced;
  if (words <= kBwdMaxRowThreads) return int(ceil_div(words, int64_t(32)) * 32);
  const int64_t vpt = ceil_div(words, int64_t(kBwdMaxMultiWordThreads));
  return int(ceil_div(ceil_div(words, vpt), int64_t(32)) * 32);
}

// The row kernel at one word per thread: 128 registers (its __maxnreg__; 126-128 used, none spilled) with the next
// unit's words loaded ahead (bwd_prefetch), two blocks an SM; at more words, 255 and no loads ahead. H200, a
// standalone harness over the release launcher (branch exp/bwd-reduction-phase, experiments/qk_bwd_rows), us:
//
// | kernel | LTX-Video [2, 2688, 2048] | Wan [2, 32760, 1536], [1, S, 128] tables | the same, [B, S, D] tables |
// |---|---|---|---|
// | e47c04c (96 registers at <= 192 threads, 3 blocks an SM) | 63.9 | 515.4 | 522.1 |
// | weights, table columns, dn and (b, s) kept per thread, rounding compiled in | 56.6 | 431.0 | 472.4 |
// | the same at 128 registers with the next unit ahead, 2 blocks an SM | **49.3** | **374.6** | **410.0** |
//
// Lost: a shared-memory ring of 2-3 units (cp.async; 72-75 / 669-800 / 585-727), the next unit ahead at 96
// registers (spills: 541 at Wan), at 80 or 64 registers to fit more blocks (spills: 485-1195 at Wan), 3 or 4 blocks
// an SM by the split at 128 (Wan 381-432). At more words per thread the prefetch and kept dn spill (VPT 4: 700 bytes).
constexpr int bwd_row_registers(int vpt) { return vpt > 1 ? 255 : 128; }
constexpr bool bwd_prefetch(int vpt) { return vpt == 1; }
// Development builds: bwd_prefetch 0 / 1 forces it, for A/B.
inline int bwd_forced_prefetch() {
  const int forced = tuning::override_of(tuning::Knob::kQkBwdPrefetch);
  return forced == 0 || forced == 1 ? forced : -1;
}

// Units (norm groups of q and k of a token) per block of the block and row kernels: common/column_sum's split (at
// least 8), a function of the sizes and form alone, so dw's summation order is too. At most one wave of the row
// kernel (2 blocks an SM on 132 SMs: bwd_row_registers) where the call's form takes it (row_threads > 0:
// whole-row norm, interleaved, word-sized rows; alignment aside), else at most 1024.
// H200, a standalone harness (branch exp/bwd-split-harness) over forced units per block, two runs, us: LTX-Video
// 2B's [2, 2688, 2048] 672 blocks 90.6-91.7 -> 256 (21 units) 73.8-75.3 (489: 84, 336: 94-95, 168: 100-102); Wan
// 1.3B's [2, 32760, 1536] (at 128 registers) 1024 blocks 646.9-647.1 -> 264 (249 units) 618.6-620.3 (525: 626-629,
// 656: 724-727, 132: 1042-1044). Development builds: bwd_rows R takes at least R per block instead (at most 1024
// blocks), for sweeps.
inline int64_t bwd_row_max_blocks() { return 2 * column_sum_config::kWaveSms; }
inline int64_t bwd_rows_per_block(int64_t units, int row_threads) {
  const int forced = tuning::override_of(tuning::Knob::kQkBwdRows);
  if (forced < 1)
    return fixed_rows_per_block(units, column_sum_config::kMinRowsPerBlock,
                                row_threads > 0 ? bwd_row_max_blocks() : column_sum_config::kMaxBlocks);
  const int64_t spread = ceil_div(units, column_sum_config::kMaxBlocks);
  return spread > forced ? spread : int64_t(forced);
}

// Runs of units the block and row kernels' split cuts the units into, each split by bwd_rows_per_block
// (then column_sum per run and over the runs): one (not swept). Development builds: bwd_runs R (1..64)
// takes R: column_sum's first pass then has R times the threads, each adding 1/R of the rows (LTX's 672
// partial rows: 84 loads per thread in one run; the same 672 rows in 8 runs: ~11), and with bwd_rows
// more blocks than column_sum's 1024 are possible (Wan's 65520 units: 64 per block in one run; 8 runs
// of 8: 8190 blocks, 8x the partials).
constexpr int kBwdMaxRuns = 64;
inline int64_t bwd_row_runs() {
  const int forced = tuning::override_of(tuning::Knob::kQkBwdRuns);
  return forced >= 1 && forced <= kBwdMaxRuns ? forced : 1;
}

inline int bwd_pairs_per_thread(int64_t head_dim) {
  if (head_dim < 512 || head_dim > 2 * int64_t(kBwdThreads) * kBwdMaxPairsPerThread) return 0;  // warp kernel
  return int((head_dim / 2 + kBwdThreads - 1) / kBwdThreads);
}

}  // namespace qk_rmsnorm_rope_config
}  // namespace ltx
