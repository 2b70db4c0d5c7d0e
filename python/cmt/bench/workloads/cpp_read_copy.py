"""model-load-cpp-warm: a C++ loader (cpp_read_copy.cpp) that std::ifstream::reads the model-load
family's 3.9 GB safetensors file (--quick 0.5 GB), in the page cache, tensor by tensor into one
reused pageable buffer and cudaMemcpys each to the GPU; it checks the GPU's bytes against a checksum
of the file. Built with g++ against the CUDA runtime (found beside nvcc, under CUDA_HOME or
/usr/local/cuda, or in the nvidia pip packages); without one the workload is a skip. The program's
own timer is the inner time; under `cmt run` its copies are cmt's."""

import json
import subprocess
import sys
from pathlib import Path

from cmt.bench.workloads import _cpp_loader, _model
from cmt.bench.workloads._common import emit, need_gpu_memory, parse_args, prepared, require, skip, torch_cuda

args = parse_args()
torch = torch_cuda()  # makes the model
require("safetensors")
need_gpu_memory(torch, int(1.2 * _model.model_bytes(args.quick)))
exe = _cpp_loader.build(args.work_dir)
if not isinstance(exe, Path):
    skip(exe)
model = _model.ensure_model(torch, args.work_dir, args.quick)
plan_file = _cpp_loader.plan(model)
if args.prepare:
    prepared(file_bytes=model.stat().st_size)

_model.warm(model)
resident = _model.resident_fraction(model)
proc = subprocess.run([str(exe), str(plan_file)], capture_output=True, text=True)
if proc.returncode != 0:
    sys.exit(f"the C++ loader failed (exit {proc.returncode}): {proc.stderr.strip()[-300:]} {proc.stdout.strip()}")
result = json.loads(proc.stdout.strip().splitlines()[-1])
assert result["checksum_ok"], result
emit(result["seconds"], result["bytes"], "ifstream::read + cudaMemcpy, tensor by tensor", tensors=result["tensors"],
     cache="warm", resident_before=None if resident is None else round(resident, 3))
