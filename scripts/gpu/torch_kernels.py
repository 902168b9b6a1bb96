"""A few training steps of a small model on the GPU (a convolution, pooling, layer norm,
AdamW), for tracing: run.sh's `zipapp` check traces it with `--trace-out` and `--json`
together and compares the timeline's launch slices with the JSON's launches.

    python3 ebpf-cuda.pyz --json -o torch.jsonl -- python3 torch_kernels.py --maps-out maps.txt

--maps-out writes this process's /proc/self/maps at the end, so check_trace.py can say in
which file each launch address it could not name lies.
"""
import argparse
import shutil
import time

import torch
import torch.nn.functional as F


def train(steps: int) -> float:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(16 * 16 * 16, 128), torch.nn.ReLU(),
        torch.nn.LayerNorm(128), torch.nn.Linear(128, 10)).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    images = torch.randn(32, 3, 32, 32, device="cuda")
    labels = torch.randint(0, 10, (32,), device="cuda")
    loss = torch.zeros((), device="cuda")
    for _ in range(steps):
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    torch.cuda.synchronize()
    return float(loss)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--maps-out", help="copy /proc/self/maps here at the end")
    options = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("torch_kernels: no CUDA device")
    loss = train(options.steps)
    print("torch_kernels: torch %s, CUDA %s, %s, %d steps, loss %.4f" % (
        torch.__version__, torch.version.cuda, torch.cuda.get_device_name(), options.steps,
        loss))
    if options.maps_out:
        shutil.copyfile("/proc/self/maps", options.maps_out)
    time.sleep(0.5)  # the tracer reads the last events while this process still lives


if __name__ == "__main__":
    main()
