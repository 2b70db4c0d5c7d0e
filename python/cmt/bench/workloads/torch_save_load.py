"""torch.save of a multi-GB state dict that lives on the GPU, then torch.load(map_location='cuda')."""

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
nbytes = GiB if args.quick else 4 * GiB
tensors = 16
need_gpu_memory(torch, int(2.2 * nbytes))
need_host_memory(3 * nbytes)
if args.prepare:
    prepared()

state = {f"layer{i}.weight": torch.randn(nbytes // tensors // 4, device="cuda") for i in range(tensors)}
torch.cuda.synchronize()
path = args.work_dir / f"state-dict-{nbytes >> 20}M.pt"
try:
    with Timer() as save:
        torch.save(state, path)  # device to host copies into new memory, then the file write
    with Timer() as load:
        loaded = torch.load(path, map_location="cuda")
        torch.cuda.synchronize()
    assert all(torch.equal(loaded[k], state[k]) for k in state)
finally:
    path.unlink(missing_ok=True)
emit(save.seconds + load.seconds, 2 * nbytes, "torch.save + torch.load(map_location='cuda')",
     parts={"save_s": save.seconds, "load_s": load.seconds})
