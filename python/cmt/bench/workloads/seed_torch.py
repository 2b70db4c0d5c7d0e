"""The seed article's example: np.zeros((1024, 3, 224, 224)) to CUDA through torch, back as numpy."""

import numpy as np

from cmt.bench.workloads._common import Timer, emit, need_gpu_memory, parse_args, prepared, torch_cuda

args = parse_args()
torch = torch_cuda()
shape = (256 if args.quick else 1024, 3, 224, 224)
repeats = 2 if args.quick else 5
nbytes = int(np.prod(shape)) * 4
need_gpu_memory(torch, 2 * nbytes)
if args.prepare:
    prepared()

torch.cuda.init()
with Timer() as to_cuda:
    for _ in range(repeats):
        a = np.zeros(shape, dtype=np.float32)  # fresh each time, as a program building batches does
        b = torch.from_numpy(a).to("cuda")
        torch.cuda.synchronize()
with Timer() as back:
    for _ in range(repeats):
        c = np.asarray(b.cpu())
assert c.shape == shape and not c.any()
emit(to_cuda.seconds + back.seconds, 2 * repeats * nbytes, f"from_numpy().to('cuda') + np.asarray(.cpu()) x{repeats}",
     parts={"to_cuda_s": to_cuda.seconds, "to_numpy_s": back.seconds})
