"""Does compute-sanitizer initcheck flag reads of a plain cuBLAS GEMM output on
this GPU? (If so, its reports for linear_gelu are about cuBLAS's stores, e.g.
Hopper TMA stores that initcheck does not track, not about our code.)
    compute-sanitizer --tool initcheck python3 scripts/initcheck_cublas_probe.py"""
import torch

x = torch.randn(64, 128, device="cuda", dtype=torch.bfloat16)
w = torch.randn(256, 128, device="cuda", dtype=torch.bfloat16)
y = torch.nn.functional.linear(x, w)
print("plain GEMM output read back:", float(y.double().sum()))
