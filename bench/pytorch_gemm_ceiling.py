"""PyTorch's GEMM rate on this machine: the best TFLOP/s of torch.matmul (oneDNN on the CPU)
over the shapes of the benchmark models' projections, in fp32 or on bf16 tensors.

bench/moe_vs_pytorch.sh prints the models' speed as a percentage of this rate, measured in the
same run, next to the percentage of moetron's own start-up probe: a machine's GEMM ceiling is
the best any GEMM reaches there, not only moetron's. ONEDNN_MAX_CPU_ISA limits the instructions
oneDNN may use (AVX512_CORE_BF16: AVX-512 BF16 without AMX), so that its ceiling and
moetron's MOETRON_GEMM_BF16 kernel can be compared on the same instructions.

Prints one JSON line: {"dtype", "threads", "tflops" (the best), "shapes": {"MxNxK": tflops}}.
"""
import argparse
import json
import time

import torch

# (M, N, K) of y = x·Wᵀ in the bench models (hidden 512, expert widths 256 and 1024, 4096
# tokens) and two square ones
SHAPES = ((4096, 1024, 512), (4096, 512, 1024), (1024, 2048, 512), (1024, 1024, 1024), (512, 512, 512))


def best_rate(m, n, k, dtype, repeats):
    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    for _ in range(3):
        a @ b
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = max(best, 2.0 * m * n * k / (time.perf_counter() - start) / 1e12)
    return best


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--repeats", type=int, default=12, help="timed products per shape; the best counts [12]")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    rates = {f"{m}x{n}x{k}": best_rate(m, n, k, dtype, args.repeats) for m, n, k in SHAPES}
    print(json.dumps({"dtype": args.dtype, "threads": args.threads, "tflops": max(rates.values()), "shapes": rates}))


if __name__ == "__main__":
    main()
