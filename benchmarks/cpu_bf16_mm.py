"""bf16 matrix products on the CPU, in the layouts a linear layer's step uses: the venv's
torch on this machine, gpt's linear shapes at N tokens. A linear y = x W^T (W is [out, in], row-
major) runs three products: the forward x @ W^T, the input gradient g @ W and the weight gradient
g^T @ x. Prints each product's time in fp32 and in bf16, and the input gradient's with W given
column-major (W^T made contiguous, then viewed back): the same values through another kernel,
whether its bits equal the plain call's, and each one's largest error against fp32. On a CPU
without native bf16 (no avx512_bf16), LibTorch 2.11's g @ W in bf16 was 12-16x slower than the
column-major call (docs/benchmarks.md).

usage: cpu_bf16_mm.py [--tokens 1024] [--shapes 256x256,704x256,256x704] [--threads 2] [--repeat 3]
"""
import argparse
import time

import torch


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=1024, help="rows of x and g (gpt small: 8 samples x 128 tokens)")
    p.add_argument("--shapes", default="256x256,704x256,256x704",
                   help="comma-separated OUTxIN of the weights (gpt small: attention, FFN up, FFN down)")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--repeat", type=int, default=3)
    return p.parse_args()


def ms(f, repeat):
    f()  # the first call may pick or pack
    start = time.perf_counter()
    for _ in range(repeat):
        f()
    return (time.perf_counter() - start) / repeat * 1000


def main():
    a = parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {a.threads} threads, {a.tokens} tokens; times in ms (mean of {a.repeat})")
    print(f"{'W [out, in]':>12} {'dtype':>9} {'x @ W^T':>9} {'g @ W':>9} {'g @ W, W col-major':>19} {'g^T @ x':>9}")
    for shape in a.shapes.split(","):
        out_f, in_f = (int(v) for v in shape.split("x"))
        x32, w32, g32 = torch.randn(a.tokens, in_f), torch.randn(out_f, in_f), torch.randn(a.tokens, out_f)
        results = {}
        for dtype in (torch.float32, torch.bfloat16):
            x, w, g = x32.to(dtype), w32.to(dtype), g32.to(dtype)
            w_col = w.t().contiguous().t()  # the same values, column-major
            times = [ms(lambda: torch.mm(x, w.t()), a.repeat), ms(lambda: torch.mm(g, w), a.repeat),
                     ms(lambda: torch.mm(g, w_col), a.repeat), ms(lambda: torch.mm(g.t(), x), a.repeat)]
            results[dtype] = (torch.mm(g, w), torch.mm(g, w_col))
            print(f"{shape:>12} {str(dtype).replace('torch.', ''):>9} " + f"{times[0]:9.1f} {times[1]:9.1f} "
                  f"{times[2]:19.1f} {times[3]:9.1f}")
        plain, col = results[torch.bfloat16]
        exact = results[torch.float32][0]
        print(f"{'':>12} bf16's input gradient: col-major bits {'equal' if torch.equal(plain, col) else 'differ'} "
              f"(largest difference {(plain.float() - col.float()).abs().max().item():.3g}); largest error against "
              f"fp32: row-major {(plain.float() - exact).abs().max().item():.3g}, col-major "
              f"{(col.float() - exact).abs().max().item():.3g}")


if __name__ == "__main__":
    main()
