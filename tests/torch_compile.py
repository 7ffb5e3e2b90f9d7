"""torch.compile on the GPU: Inductor writes Triton kernels, and Triton compiles them and the
C launcher it links with -lcuda (where TRITON_LIBCUDA_PATH points) while the program runs.
Prints what tests/test_torch.py compares with native: whether the compiled forward and backward
agree with eager mode, and their values. Exit 2: no CUDA device; 3: no Triton."""
import sys

import torch

if not torch.cuda.is_available():
    print("no CUDA device")
    sys.exit(2)
try:
    import triton  # noqa: F401 (Inductor's GPU code generator)
except ImportError:
    print("no Triton")
    sys.exit(3)

torch.manual_seed(0)


def f(x, y):
    # Pointwise work fused into a row reduction, and a matmul (cuBLAS) feeding a softmax.
    return (torch.sin(x) * y + x.relu()).sum(dim=1), torch.softmax(x @ y.T, dim=-1)


x = torch.randn(256, 512, device="cuda", requires_grad=True)
y = torch.randn(256, 512, device="cuda")
compiled = torch.compile(f)
rows, probs = compiled(x, y)
(rows.sum() + (probs * probs).sum()).backward()
grad = x.grad.clone()
x.grad = None
eager_rows, eager_probs = f(x, y)
(eager_rows.sum() + (eager_probs * eager_probs).sum()).backward()
torch.cuda.synchronize()
print("matches eager:", torch.allclose(rows, eager_rows, rtol=1e-3, atol=1e-3),
      torch.allclose(probs, eager_probs, rtol=1e-3, atol=1e-5),
      torch.allclose(grad, x.grad, rtol=1e-3, atol=1e-3))
print("rows:", " ".join(f"{v:.9e}" for v in rows[:8].tolist()))
print("probs sum:", f"{probs.double().sum().item():.9e}")
print("grad sum:", f"{grad.double().sum().item():.9e}")
