"""PyTorch `.to('cuda')` and `.cpu()` of a 1 GiB float32 tensor in pageable memory."""

from cmt.bench.workloads._common import GiB, Timer, emit, need_gpu_memory, parse_args, prepared, torch_cuda

args = parse_args()
torch = torch_cuda()
nbytes = GiB // 4 if args.quick else GiB
repeats = 2 if args.quick else 5
need_gpu_memory(torch, 2 * nbytes)
if args.prepare:
    prepared()

host = torch.rand(nbytes // 4)  # pageable (not pinned), every page touched
torch.cuda.init()
with Timer() as to_cuda:
    for _ in range(repeats):
        dev = host.to("cuda")
        torch.cuda.synchronize()
with Timer() as to_cpu:
    for _ in range(repeats):
        back = dev.cpu()  # a new pageable tensor each time, as programs do
        del back
assert torch.equal(dev.cpu(), host)
emit(to_cuda.seconds + to_cpu.seconds, 2 * repeats * nbytes, f".to('cuda') + .cpu() x{repeats}",
     parts={"to_cuda_s": to_cuda.seconds, "cpu_s": to_cpu.seconds})
