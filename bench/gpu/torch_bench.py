"""PyTorch workloads timed with torch.cuda.synchronize, for bench/gpu/traced.py.

    python3 torch_bench.py mlp [--steps 200] [--reps 5]    # ms per MLP training step
    python3 torch_bench.py tiny [--ops 20000] [--reps 5]   # us per tiny op (x.add_(1))

Prints `result name=<what> value=<figure>` per repetition.
"""
import argparse
import time

import torch


def mlp(steps: int, reps: int) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                                torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
                                torch.nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(256, 1024, device="cuda")
    y = torch.randn(256, 1024, device="cuda")

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()

    for _ in range(20):
        step()
    torch.cuda.synchronize()
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        print("result name=mlp_step_ms value=%.4f" % ((time.perf_counter() - t0) * 1e3 / steps),
              flush=True)


def tiny(ops: int, reps: int) -> None:
    x = torch.zeros(16, device="cuda")
    for _ in range(1000):
        x.add_(1)
    torch.cuda.synchronize()
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(ops):
            x.add_(1)
        torch.cuda.synchronize()
        print("result name=tiny_op_us value=%.3f" % ((time.perf_counter() - t0) * 1e6 / ops),
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["mlp", "tiny"])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--ops", type=int, default=20000)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    if args.what == "mlp":
        mlp(args.steps, args.reps)
    else:
        tiny(args.ops, args.reps)


if __name__ == "__main__":
    main()
