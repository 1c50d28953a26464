{
  description = "ltx-kernels: CUDA kernels for video diffusion transformers on Hopper";
  inputs = { kernel-builder.url = "github:huggingface/kernels"; };
  outputs = { self, kernel-builder, ... }:
    kernel-builder.lib.genKernelFlakeOutputs {
      inherit self;
      path = ./.;
    };
}
