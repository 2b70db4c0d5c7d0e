"""PyTorch distributed checkpoint: async_save of a model on the GPU, in one process. The inner timer
is the blocking part of the first save (staging the state dict into host memory), as a training
loop sees it; the total until the write finished is reported too."""

import os

from cmt.bench.workloads._common import (
    GiB,
    Timer,
    emit,
    need_gpu_memory,
    need_host_memory,
    parse_args,
    prepared,
    skip,
    torch_cuda,
)

args = parse_args()
torch = torch_cuda()
import torch.distributed as dist  # noqa: E402

if not dist.is_available():
    skip("this PyTorch build has no torch.distributed")
try:
    import torch.distributed.checkpoint as dcp
except ImportError as e:
    skip(f"torch.distributed.checkpoint is unavailable ({e.msg})")
if not hasattr(dcp, "async_save"):
    skip("this PyTorch has no torch.distributed.checkpoint.async_save")
nbytes = GiB if args.quick else 4 * GiB
need_gpu_memory(torch, int(1.2 * nbytes))
need_host_memory(2 * nbytes)
if args.prepare:
    prepared()

layers = 16
width = int((nbytes // layers // 4) ** 0.5)
model = torch.nn.Sequential(*(torch.nn.Linear(width, width, bias=False, device="cuda") for _ in range(layers)))
store = args.work_dir / f"dcp-store-{os.getpid()}"
dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
checkpoint = args.work_dir / f"dcp-{os.getpid()}"
torch.cuda.synchronize()
try:
    with Timer() as total:
        with Timer() as staging:
            future = dcp.async_save({"model": model.state_dict()}, checkpoint_id=str(checkpoint))
        future.result()
finally:
    dist.destroy_process_group()
    store.unlink(missing_ok=True)
    for f in checkpoint.glob("*") if checkpoint.exists() else ():
        f.unlink()
    if checkpoint.exists():
        checkpoint.rmdir()
size = sum(p.numel() * p.element_size() for p in model.parameters())
emit(staging.seconds, size, "first async_save call (staging)", parts={"staging_s": staging.seconds,
                                                                      "until_written_s": total.seconds})
