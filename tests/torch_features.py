"""PyTorch's CUDA features beyond a training loop, as issue #13 lists them: the device's name
and capability, streams ordered by events and timed by them, a whole training step captured
into a CUDA graph and replayed on new data, page-locked memory with non-blocking copies both
ways, torch.cuda.synchronize, and the caching allocator's own count of its memory. Each check
prints one line; through Wormhole the script must print what it prints natively (fixed seeds,
TF32 off, and cuBLAS's deterministic workspace: CUBLAS_WORKSPACE_CONFIG=:4096:8)."""
import torch


def streams_and_events(dev):
    a = torch.randn(1024, 1024, device=dev)
    side = torch.cuda.Stream()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    # `a` was made on the default stream: the side stream waits for it.
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        start.record()
        b = a @ a
        end.record()
    # And the default stream for the side stream's product.
    torch.cuda.current_stream().wait_stream(side)
    b.record_stream(torch.cuda.current_stream())
    total = b.sum()
    end.synchronize()
    print("event timing measured:", start.elapsed_time(end) > 0)
    print("side stream done after its event:", side.query())
    print(f"sum of a @ a: {total.item():.4f}")


def graph_replays(dev):
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)
    ).to(dev)
    loss_fn = torch.nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    static_x = torch.randn(32, 64, device=dev)
    static_y = torch.randint(0, 10, (32,), device=dev)
    # Warm-up on a side stream before capture, as PyTorch's documentation does.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            loss_fn(model(static_x), static_y).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = loss_fn(model(static_x), static_y)
        static_loss.backward()
        opt.step()
    data = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(10):
        static_x.copy_(torch.randn(32, 64, generator=data).to(dev))
        static_y.copy_(torch.randint(0, 10, (32,), generator=data).to(dev))
        graph.replay()
        losses.append(static_loss.item())
    print("graph replays, losses:", " ".join(f"{x:.6f}" for x in losses))


def pinned_copies(dev):
    host = torch.arange(1 << 20, dtype=torch.float32).pin_memory()
    back = torch.empty(1 << 20, dtype=torch.float32, pin_memory=True)
    print("page-locked:", host.is_pinned(), back.is_pinned())
    on_device = host.to(dev, non_blocking=True)
    back.copy_(on_device * 2, non_blocking=True)
    torch.cuda.synchronize()
    print("non-blocking copies both ways:", torch.equal(back, host * 2))


def main():
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    print("available:", torch.cuda.is_available(), "devices:", torch.cuda.device_count())
    print("device:", torch.cuda.get_device_name(), torch.cuda.get_device_capability())
    streams_and_events(dev)
    graph_replays(dev)
    pinned_copies(dev)
    torch.cuda.synchronize()
    print("memory allocated by the caching allocator:", torch.cuda.memory_allocated())


if __name__ == "__main__":
    main()
