"""model-load: one loader (--loader, _loaders.py) reading the 3.9 GB Llama-shaped model (_model.py;
--quick 0.5 GB) onto the GPU, from the page cache (--cache warm) or from the disk (--cache cold:
evicted with posix_fadvise before the timer; what stayed resident is reported). Every tensor is then
checked bit for bit against its seeded generator. Each loader's module is imported before the
timer, as a program imports it at its start (cmt.io's import starts faulting its staging in). The
family's workloads share one work folder, so the model is written once (by the first --prepare)."""

from cmt.bench.workloads import _model
from cmt.bench.workloads._common import (
    Timer,
    emit,
    need_gpu_memory,
    need_host_memory,
    parse_args,
    prepared,
    require,
    torch_cuda,
)
from cmt.bench.workloads._loaders import LOADERS

args = parse_args(loader=list(LOADERS), cache=["warm", "cold"])
loader = LOADERS[args.loader]
torch = torch_cuda()
require("safetensors")
require(loader.needs)
nbytes = _model.model_bytes(args.quick)
need_gpu_memory(torch, int(2.2 * nbytes))  # the model, and the check's tensor of the same size at most
need_host_memory(int(2.2 * nbytes))  # the loaders that stage through host memory, and torch.save's copy

path = _model.ensure_model(torch, args.work_dir, args.quick)
if loader.source == "pt":
    path = _model.ensure_pt(torch, args.work_dir, args.quick)
if args.prepare:
    prepared(file_bytes=path.stat().st_size)

torch.cuda.init()
torch.empty(1, device="cuda")  # the context, before the timer
if args.cache == "warm":
    _model.warm(path)
    resident = _model.resident_fraction(path)
else:
    resident = _model.evict(path)
with Timer() as load:
    loaded = loader.load(torch, path)
    torch.cuda.synchronize()
_model.verify(torch, loaded, args.quick)
emit(load.seconds, path.stat().st_size, loader.label, cache=args.cache,
     resident_before=None if resident is None else round(resident, 3), layers=_model.layers(args.quick))
