"""Dequantize SmolLM2-135M-Instruct's GGUF into plain safetensors folders (run by .ci/real-target.sh).

    python real_target_convert.py GGUF_DIR GGUF_NAME OUT_DIR

transformers' GGUF loader (needs the packages gguf and accelerate) returns a Llama whose config carries a
quantization_config and whose save_pretrained refuses to write; so a fresh LlamaForCausalLM is built from
the config without it and given the loaded state dict, then saved once per dtype with the tokenizer (and
its chat template). Writes OUT_DIR/bf16 and OUT_DIR/f32, each to a temp folder renamed into place.
"""

import os
import shutil
import sys


def main(gguf_dir: str, gguf_name: str, out_dir: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    state = loaded.state_dict()
    for name, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        config.dtype = dtype
        fresh = LlamaForCausalLM(config)
        fresh.load_state_dict(state, strict=True)
        fresh = fresh.to(dtype)
        fresh.generation_config.do_sample = False
        tmp = os.path.join(out_dir, f".{name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        fresh.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        final = os.path.join(out_dir, name)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: real_target_convert.py GGUF_DIR GGUF_NAME OUT_DIR")
    main(*sys.argv[1:])
