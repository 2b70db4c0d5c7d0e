"""safetensors load_file(device='cuda') of a 2 GiB file in the page cache. safetensors copies each
tensor from the file's mapping into a pinned buffer of its own with one thread's memcpy, then hands
the driver a pinned copy: cmt sees the large memcpy (host_copy.hpp), not a pageable copy.
`--prepare` writes the file once into the work folder, so both timed runs read it from the page
cache."""

from cmt.bench.workloads._common import GiB, Timer, emit, need_gpu_memory, parse_args, prepared, require, torch_cuda

args = parse_args()
torch = torch_cuda()
safetensors_torch = require("safetensors.torch", "safetensors")
nbytes = GiB // 4 if args.quick else 2 * GiB
tensors = 16 if args.quick else 32  # as many tensors as a model's larger layers: 64 MiB each
path = args.work_dir / f"weights-{nbytes >> 20}MiB.safetensors"
need_gpu_memory(torch, int(1.2 * nbytes))
if not path.exists():
    each = nbytes // tensors
    safetensors_torch.save_file({f"w{i}": torch.randint(0, 255, (each,), dtype=torch.uint8) for i in range(tensors)},
                                str(path))
if args.prepare:
    prepared(file_bytes=path.stat().st_size)

torch.cuda.init()
path.read_bytes()  # in the page cache, as after --prepare
with Timer() as load:
    loaded = safetensors_torch.load_file(str(path), device="cuda")
    torch.cuda.synchronize()
check = safetensors_torch.load_file(str(path))  # on the CPU, plainly
assert all(torch.equal(loaded[k].cpu(), v) for k, v in check.items())
emit(load.seconds, path.stat().st_size, "load_file(device='cuda')")
