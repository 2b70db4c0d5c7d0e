"""Training steps with activations offloaded to the CPU (torch.autograd.graph.save_on_cpu, pageable)."""

from cmt.bench.workloads._common import (
    GiB,
    Timer,
    emit,
    need_gpu_memory,
    need_host_memory,
    parse_args,
    prepared,
    torch_cuda,
)

args = parse_args()
torch = torch_cuda()
batch, width, layers = (4096, 4096, 8) if args.quick else (8192, 4096, 16)
steps = 2 if args.quick else 3
activation = batch * width * 2  # bf16
need_gpu_memory(torch, 4 * activation + 2 * GiB)
need_host_memory(3 * layers * activation)
if args.prepare:
    prepared()

torch.manual_seed(0)
model = torch.nn.Sequential(*(m for _ in range(layers) for m in (
    torch.nn.Linear(width, width, device="cuda", dtype=torch.bfloat16), torch.nn.ReLU())))
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(batch, width, device="cuda", dtype=torch.bfloat16)


def step() -> None:
    with torch.autograd.graph.save_on_cpu(pin_memory=False):  # pageable, the default
        loss = model(x).float().square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


step()  # warm-up: kernels chosen, allocator primed
torch.cuda.synchronize()
with Timer() as t:
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
# save_on_cpu moves every tensor saved for backward (each Linear's input and weight, each ReLU's
# output) to the host and back.
moved = steps * 2 * layers * (2 * activation + width * width * 2)
emit(t.seconds, moved, f"{steps} training steps", seconds_per_step=t.seconds / steps)
