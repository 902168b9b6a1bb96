"""Training loops as PyTorch runs them, for `ebpf-cuda analyze` (tests/test_analyze_graphs.py):
the stand-in PyTorch (site-packages/faketorch.py, library frames) on the stand-in libcudart.
Lines the test reads carry a `# <- NAME` marker.

    python graph_loops.py SCENARIO LIBCUDART

- `graphs`: scripts/gpu/analyze_check.py's CUDAGraph variant: 3 warm-up steps on a side
  stream, one captured with `graph(g)`, then STEPS iterations of a pinned input copy and
  `g.replay()`;
- `compiled`: its torch.compile(mode="reduce-overhead") variant (the loop calls the
  compiled forward: warm-up, record, then replays); `pending`: the same as D35 ran it, a
  forward with grad enabled and no backward, whose calls all warm up (eagerly);
- `threads`: the planted `empty_cache()` per step of a training step whose backward runs on
  the autograd thread: both threads allocate or free in every step.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "site-packages"))
import faketorch  # noqa: E402

STEPS = 20
LAYERS = 8
BATCH = 1 << 16  # bytes of the input batch (64 x 256 floats)


def set_up():
    cuda = faketorch.Cuda(sys.argv[2])
    model = faketorch.Model(cuda, LAYERS)
    return cuda, model, cuda.pinned(BATCH), cuda.malloc(BATCH)


def graphs() -> None:
    cuda, model, pinned, static_x = set_up()
    side = cuda.stream()
    cuda.wait_stream(side, None)
    for _ in range(3):
        model.step(side)
    cuda.wait_stream(None, side)
    g = faketorch.CUDAGraph(cuda)
    capture_stream = cuda.stream()
    with faketorch.graph(g, capture_stream):  # <- capture
        model.step(capture_stream)
    for _ in range(STEPS):
        cuda.copy_from_pinned(static_x, pinned, BATCH, None)  # <- input
        g.replay()  # <- replay
    cuda.lib.cudaDeviceSynchronize()
    model.close()


def compiled(pending: bool = False) -> None:
    cuda, model, pinned, static_x = set_up()
    run = faketorch.compile(cuda, model, BATCH, pending=pending)
    for _ in range(STEPS):
        cuda.copy_from_pinned(static_x, pinned, BATCH, None)
        run(static_x)  # <- compiled
    cuda.lib.cudaDeviceSynchronize()
    model.close()


def threads() -> None:
    cuda, model, pinned, static_x = set_up()
    for _ in range(STEPS):
        cuda.copy_from_pinned(static_x, pinned, BATCH, None)
        model.step(None)
        cuda.empty_cache()  # <- churn
    cuda.lib.cudaDeviceSynchronize()
    model.close()


if __name__ == "__main__":
    {"graphs": graphs, "compiled": compiled, "pending": lambda: compiled(True),
     "threads": threads}[sys.argv[1]]()
