"""Hugging Face transformers: from_pretrained(device_map='cuda') of a Llama-shaped model saved as
safetensors. The model is made here from a config with random weights (nothing is downloaded);
`--prepare` writes it once into the work folder, so both timed runs read it from the page cache."""

from cmt.bench.workloads._common import (
    GiB,
    Timer,
    emit,
    need_gpu_memory,
    parse_args,
    prepared,
    require,
    skip,
    torch_cuda,
)

args = parse_args()
torch = torch_cuda()
transformers = require("transformers")
require("safetensors")
layers = 4 if args.quick else 30
# About 63M parameters per layer plus 131M of embeddings: 2.0 B parameters (4.0 GB in bf16) in full.
config = transformers.LlamaConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=layers,
                                  num_attention_heads=16, num_key_value_heads=8, vocab_size=32000)
# transformers 4.56 renamed torch_dtype to dtype; the old name still works but warns.
DTYPE = {"dtype" if tuple(int(x) for x in transformers.__version__.split(".")[:2]) >= (4, 56) else "torch_dtype":
         torch.bfloat16}
model_dir = args.work_dir / f"hf-llama-{layers}l"


def make_model() -> None:
    """Random weights without running the slow initialisers: shapes from a model on the meta device."""
    from safetensors.torch import save_file

    with torch.device("meta"):
        meta = transformers.AutoModelForCausalLM.from_config(config, **DTYPE)
    tensors = {name: torch.empty(t.shape, dtype=t.dtype).uniform_(-0.02, 0.02) for name, t in meta.state_dict().items()}
    model_dir.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(model_dir)
    save_file(tensors, str(model_dir / "model.safetensors"), metadata={"format": "pt"})


if not (model_dir / "model.safetensors").exists():
    make_model()
nbytes = (model_dir / "model.safetensors").stat().st_size
need_gpu_memory(torch, int(1.2 * nbytes))
if args.prepare:
    prepared(model_bytes=nbytes)

torch.cuda.init()
try:
    with Timer() as load:
        model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, device_map="cuda", **DTYPE)
        torch.cuda.synchronize()
except (ImportError, ValueError) as e:
    if "accelerate" in str(e):
        skip("device_map='cuda' needs the accelerate package with this transformers version")
    raise
assert next(model.parameters()).is_cuda
emit(load.seconds, nbytes, "from_pretrained(device_map='cuda')", layers=layers, model_gib=round(nbytes / GiB, 2))
