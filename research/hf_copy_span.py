"""How much of a from_pretrained(device_map='cuda') is its host-to-GPU copies (issue 23's hf-load
criterion: >= 3x under cmt run). The rest of the call (config, the model made on the meta device,
tying and checking weights) cmt cannot speed up, so plain time / that rest is the speed-up's ceiling.

Loads the hf-load workload's model (made by `hf_load.py --prepare --work-dir DIR`) with
`torch.Tensor.to`, `.cuda` and `.copy_` wrapped: each call that moves a CPU tensor to the GPU is an
interval. Prints one JSON line: the call's seconds, the union of those intervals (several loading
threads overlap), the time before the first and after the last, and the calls seen.

    python3 research/hf_copy_span.py /tmp/cmt-fw            (plain)
    python3 -m cmt run -- python3 research/hf_copy_span.py /tmp/cmt-fw
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch
import transformers

from cmt.profile.report import covered

spans: list[tuple[float, float]] = []
lock = threading.Lock()


def wrap(name: str) -> None:
    inner = getattr(torch.Tensor, name)

    def timed(self, *args, **kwargs):
        if self.device.type != "cpu" and name != "copy_":
            return inner(self, *args, **kwargs)
        t0 = time.perf_counter()
        out = inner(self, *args, **kwargs)
        moved = (out.device.type == "cuda") if name != "copy_" else (
            self.device.type == "cuda" and args and getattr(args[0], "device", None) is not None
            and args[0].device.type == "cpu")
        if moved:
            torch.cuda.current_stream().synchronize()  # an async copy is done when its stream is
            with lock:
                spans.append((t0, time.perf_counter()))
        return out

    setattr(torch.Tensor, name, timed)


def main() -> None:
    work = Path(sys.argv[1])
    model_dir = next(p for p in sorted(work.glob("hf-llama-*l")) if (p / "model.safetensors").exists())
    for name in ("to", "cuda", "copy_"):
        wrap(name)
    torch.cuda.init()
    torch.empty(1, device="cuda")
    t0 = time.perf_counter()
    # transformers 4.56 renamed torch_dtype to dtype (as the hf-load workload does)
    new = tuple(int(x) for x in transformers.__version__.split(".")[:2]) >= (4, 56)
    dtype = {"dtype" if new else "torch_dtype": torch.bfloat16}
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, device_map="cuda", **dtype)
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    assert next(model.parameters()).is_cuda
    starts, ends = np.array([a for a, _ in spans] or [t1]), np.array([b for _, b in spans] or [t1])
    busy = float(covered(starts, ends)[0])
    print(json.dumps({"model": model_dir.name, "inner_s": round(t1 - t0, 4), "copy_calls": len(spans),
                      "copies_union_s": round(busy, 4), "before_first_s": round(starts.min() - t0, 4),
                      "after_last_s": round(t1 - ends.max(), 4), "rest_s": round(t1 - t0 - busy, 4)}),
          flush=True)


if __name__ == "__main__":
    main()
