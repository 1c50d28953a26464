"""Benchmarks for `kernels benchmark` (kernels.benchmark.Benchmark classes).

    kernels benchmark ./                                   # the build/<variant> of this checkout
    kernels benchmark ltx-kernels/ltx-kernels --version 1  # the published kernel

The runner loads the kernel into ``self.kernel``, calls ``setup_<workload>``,
times ``benchmark_<workload>`` and, where there is one, compares ``self.out``
with what ``verify_<workload>`` returns (the eager PyTorch chain the op
replaces, also timed as the reference) by ``torch.allclose(atol=1e-2)``.
Shapes are LTX-Video 2B's (49 frames at 512x768, batch 2: 2688 tokens of
2048 channels). The ops match their eager chains bitwise or up to the order of
a mean-square sum, i.e. one ulp; the runner's tolerance is an absolute 1e-2,
so inputs are scaled to keep bf16 outputs below 2 in magnitude (one bf16 ulp
there is at most 2^-7), and the weightless norms, whose outputs are ~N(0, 1),
run in fp16 (one ulp below 8 is at most 2^-8). Only torch and the kernel are
imported: this file is uploaded to the Hub with the build.
"""

import torch
import torch.nn.functional as F

from kernels.benchmark import Benchmark

BATCH, TOKENS, DIM = 2, 2688, 2048
BF16, FP16 = torch.bfloat16, torch.float16


def _rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """float32 x * rsqrt(mean(x^2) + eps), as diffusers' RMSNorm computes it."""
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _diffusers_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """diffusers' LTX apply_rotary_emb: interleaved pairs, float32 products, one cast."""
    real, imag = x.unflatten(2, (-1, 2)).unbind(-1)
    rotated = torch.stack([-imag, real], dim=-1).flatten(2)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


class RMSNormBenchmark(Benchmark):
    seed = 0

    def setup_ltx_block_norm(self):
        # LTX's block norms: no weight (fp16, see the module docstring).
        self.x = torch.randn(BATCH, TOKENS, DIM, device=self.device, dtype=FP16)
        self.out = torch.empty_like(self.x)

    def benchmark_ltx_block_norm(self):
        self.kernel.rmsnorm(self.x, None, 1e-6, out=self.out)

    def verify_ltx_block_norm(self):
        return _rms(self.x, 1e-6).to(FP16)

    def setup_qk_norm_13b(self):
        # torch.nn.RMSNorm(4096, eps=1e-5) of LTX 13B's q/k norms, bf16 with a weight.
        self.x = torch.randn(BATCH, TOKENS, 2 * DIM, device=self.device, dtype=BF16)
        self.w = (0.25 + 0.05 * torch.randn(2 * DIM, device=self.device)).to(BF16)
        self.out = torch.empty_like(self.x)

    def benchmark_qk_norm_13b(self):
        self.kernel.rmsnorm(self.x, self.w, 1e-5, out=self.out)

    def verify_qk_norm_13b(self):
        return F.rms_norm(self.x, (2 * DIM,), self.w, 1e-5)


class AdaLNRMSNormBenchmark(Benchmark):
    seed = 0

    def setup_ltx_modulated_norm(self):
        self.x = torch.randn(BATCH, TOKENS, DIM, device=self.device, dtype=BF16)
        # 1 + scale near 0.2 keeps the output below 2 (module docstring).
        self.scale = (-0.8 + 0.05 * torch.randn(BATCH, 1, DIM, device=self.device)).to(BF16)
        self.shift = (0.1 * torch.randn(BATCH, 1, DIM, device=self.device)).to(BF16)

    def benchmark_ltx_modulated_norm(self):
        self.out = self.kernel.adaln_rmsnorm(self.x, None, self.scale, self.shift, 1e-6)

    def verify_ltx_modulated_norm(self):
        # LTX's eager block: diffusers RMSNorm (rounded), then norm * (1 + scale) + shift.
        normed = _rms(self.x, 1e-6).to(BF16)
        return normed * (1 + self.scale) + self.shift


class GatedResidualBenchmark(Benchmark):
    seed = 0

    def setup_ltx_residual(self):
        self.x = (0.3 * torch.randn(BATCH, TOKENS, DIM, device=self.device)).to(BF16)
        self.y = (0.3 * torch.randn(BATCH, TOKENS, DIM, device=self.device)).to(BF16)
        self.gate = (0.5 * torch.randn(BATCH, 1, DIM, device=self.device)).to(BF16)

    def benchmark_ltx_residual(self):
        self.out = self.kernel.gated_residual(self.x, self.y, self.gate)

    def verify_ltx_residual(self):
        return self.x + self.y * self.gate


class GEGLUBenchmark(Benchmark):
    seed = 0

    def setup_ltx_feed_forward(self):
        # The feed-forward's gated activation: [2, 2688, 2 * 8192] -> [2, 2688, 8192].
        self.h = (0.5 * torch.randn(BATCH, TOKENS, 16384, device=self.device)).to(BF16)

    def benchmark_ltx_feed_forward(self):
        self.out = self.kernel.geglu(self.h)

    def verify_ltx_feed_forward(self):
        a, b = self.h.chunk(2, dim=-1)
        return F.gelu(a, approximate="tanh") * b


class RotaryBenchmark(Benchmark):
    seed = 0

    def setup_ltx_rope(self):
        self.x = (0.5 * torch.randn(BATCH, TOKENS, DIM, device=self.device)).to(BF16)
        angles = torch.rand(1, TOKENS, DIM // 2, device=self.device) * 6.283
        self.cos = angles.cos().repeat_interleave(2, dim=-1)
        self.sin = angles.sin().repeat_interleave(2, dim=-1)
        self.out = torch.empty_like(self.x)

    def benchmark_ltx_rope(self):
        self.kernel.apply_rotary_emb(self.x, self.cos, self.sin, out=self.out)

    def verify_ltx_rope(self):
        return _diffusers_rotary(self.x, self.cos, self.sin)


class QKNormRopeBenchmark(Benchmark):
    seed = 0

    def setup_ltx_attention_prologue(self):
        # LTX self-attention: RMSNorm over all 2048 channels of q and k, then RoPE.
        self.q = torch.randn(BATCH, TOKENS, DIM, device=self.device, dtype=BF16)
        self.k = torch.randn(BATCH, TOKENS, DIM, device=self.device, dtype=BF16)
        self.wq = (0.25 + 0.05 * torch.randn(DIM, device=self.device)).to(BF16)
        self.wk = (0.25 + 0.05 * torch.randn(DIM, device=self.device)).to(BF16)
        angles = torch.rand(1, TOKENS, DIM // 2, device=self.device) * 6.283
        self.cos = angles.cos().repeat_interleave(2, dim=-1)
        self.sin = angles.sin().repeat_interleave(2, dim=-1)

    def benchmark_ltx_attention_prologue(self):
        self.out, _ = self.kernel.qk_rmsnorm_rope(self.q, self.k, self.wq, self.wk, self.cos, self.sin, 1e-5)

    def verify_ltx_attention_prologue(self):
        normed = F.rms_norm(self.q, (DIM,), self.wq, 1e-5)
        return _diffusers_rotary(normed, self.cos, self.sin)


class PixelNormBenchmark(Benchmark):
    seed = 0

    def setup_ltx_vae_decoder(self):
        # A decoder activation [B, C, T, H, W]; normalised over C (fp16, see the module docstring).
        self.x = torch.randn(2, 512, 7, 32, 48, device=self.device, dtype=FP16)

    def benchmark_ltx_vae_decoder(self):
        self.out = self.kernel.pixel_norm(self.x, 1, 1e-8)

    def verify_ltx_vae_decoder(self):
        x = self.x.float()
        return (x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + 1e-8)).to(FP16)


class Rope3DBenchmark(Benchmark):
    """Timed only: rope_3d works in place, so repeated calls keep rotating the
    same tensors; its bitwise check is tests/test_rope_axes_gpu.py."""

    seed = 0

    def setup_wan_video(self):
        # Wan 1.3B: 21 x 30 x 52 latent tokens, 12 heads of 128.
        self.q = torch.randn(1, 21 * 30 * 52, 12, 128, device=self.device, dtype=BF16)
        self.k = torch.randn(1, 21 * 30 * 52, 12, 128, device=self.device, dtype=BF16)

    def benchmark_wan_video(self):
        self.kernel.rope_3d(self.q, self.k, 21, 30, 52)
