"""A torch DataLoader (worker processes, pin_memory=False) feeding pageable image batches to the GPU."""

import os

from cmt.bench.workloads._common import GiB, Timer, emit, need_gpu_memory, parse_args, prepared, torch_cuda

args = parse_args()
torch = torch_cuda()
batch = 128
batches = 10 if args.quick else 40
sample_shape = (3, 224, 224)
need_gpu_memory(torch, 2 * GiB)
if args.prepare:
    prepared()


class Images(torch.utils.data.Dataset):
    """Samples cut from one random tensor: the loader's cost is collation, not random numbers."""

    def __init__(self, count: int):
        self.pool = torch.rand(256, *sample_shape)
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int):
        return self.pool[i % len(self.pool)]


workers = max(1, min(4, (os.cpu_count() or 2) // 4))
loader = torch.utils.data.DataLoader(Images(batch * batches), batch_size=batch, num_workers=workers,
                                     pin_memory=False, prefetch_factor=4, persistent_workers=False)
torch.cuda.init()
total = 0
with Timer() as t:
    for images in loader:
        on_gpu = images.to("cuda")
        total += on_gpu.numel() * on_gpu.element_size()
    torch.cuda.synchronize()
emit(t.seconds, total, f"{batches} batches of {batch} images", workers=workers)
