"""The workloads of `cmt bench workloads`, listed in one place.

Each workload is one script in this folder, run as its own process twice: plainly and under
`cmt run`. A script takes `--quick`, `--work-dir DIR` (scratch space shared by its runs) and
`--prepare` (check the framework, create input files; untimed, run first when `prepare` is set and
for the suite's first workload, which warms the file cache for the imports), and prints one JSON
line last:
`{"inner_s": ..., "bytes": ..., "inner_label": ...}`, or `{"skip": "one-line reason"}` (exit 0)
when its framework, a GPU or enough memory is missing. `_common.py` has the helpers. A workload of a
`family` shares its work folder with the family's others (the model-load workloads read one model),
and `args` are the script's own options (one script, many workloads).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...errors import CmtError
from ._loaders import LOADERS

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Workload:
    name: str
    script: str
    description: str
    prepare: bool = False  # writes input files both timed runs read
    smoke: bool = False  # in the --quick selection (each run costs seconds of interpreter and imports)
    args: tuple[str, ...] = ()  # the script's own options
    family: str | None = None  # workloads of a family share one work folder

    @property
    def path(self) -> Path:
        return HERE / self.script


WORKLOADS: tuple[Workload, ...] = (
    Workload("torch-tensor", "torch_tensor.py", "PyTorch .to('cuda') and .cpu() of a 1 GiB tensor", smoke=True),
    Workload("seed-torch", "seed_torch.py", "np.zeros((1024, 3, 224, 224)) to CUDA through torch and back"),
    Workload("seed-jax", "seed_jax.py", "np.zeros((1024, 3, 224, 224)) through jax.device_put and np.asarray",
             smoke=True),
    Workload("cupy", "cupy_roundtrip.py", "CuPy asarray and get of a 1 GiB array", smoke=True),
    Workload("safetensors-cuda", "safetensors_cuda.py", "safetensors load_file(device='cuda') of a 2 GiB file in the "
             "page cache", prepare=True),
    Workload("hf-load", "hf_load.py", "transformers from_pretrained(device_map='cuda') of a local safetensors model",
             prepare=True),
    Workload("torch-save-load", "torch_save_load.py", "torch.save of a GPU state dict, torch.load to CUDA", smoke=True),
    Workload("dcp-async-save", "dcp_async_save.py", "torch.distributed.checkpoint async_save of a GPU model"),
    Workload("activation-offload", "activation_offload.py", "training steps with save_on_cpu activation offload"),
    Workload("dataloader", "dataloader.py", "a DataLoader feeding pageable batches to the GPU"),
    # model-load: each loader of _loaders.py over one 3.9 GB safetensors model, from the page cache and the disk
    *(Workload(f"model-load-{name}-{cache}", "model_load.py", f"{loader.label}, {cache} page cache", prepare=True,
               args=("--loader", name, "--cache", cache), family="model-load")
      for name, loader in LOADERS.items()
      for cache in ("warm", "cold")),
    Workload("model-load-cpp-warm", "cpp_read_copy.py", "C++: std::ifstream::read of the model tensor by tensor into "
             "one pageable buffer, cudaMemcpy of each, warm page cache", prepare=True, family="model-load"),
)


def names() -> list[str]:
    return [w.name for w in WORKLOADS]


def select(only: str | None, quick: bool = False) -> list[Workload]:
    """Those named in a comma-separated list (in the suite's order); else all, or with `quick` the
    smoke selection."""
    if only is None:
        return [w for w in WORKLOADS if w.smoke or not quick]
    wanted = [n.strip() for n in only.split(",") if n.strip()]
    if not wanted:
        raise CmtError(f"--only names no workload (choose from {', '.join(names())})")
    unknown = [n for n in wanted if n not in names()]
    if unknown:
        raise CmtError(f"unknown workload {', '.join(map(repr, unknown))} (choose from {', '.join(names())})")
    return [w for w in WORKLOADS if w.name in wanted]
