"""Building a checkpoint's model costs what loading its weights costs, no more: a restarted
engine daemon (after a crash) must be answering again within seconds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from kspec.engine.models.args import ModelArgs
from kspec.engine.models.rope import inverse_frequencies
from kspec.engine.models.transformer import Transformer

REPO = Path(__file__).resolve().parents[3]


def test_loading_a_checkpoint_does_not_import_the_compiler(random_llama_dir: Path) -> None:
    # nn.Embedding's init (normal_) and the rotary table computed on the meta device run Python
    # references that import torch._dynamo: 2-5 s of every daemon start, for nothing that runs.
    # A fresh interpreter: this one may have imported it for another test.
    script = (
        "import sys, torch\n"
        "from pathlib import Path\n"
        "from kspec.engine.models.hf_folder import load_transformer\n"
        f"model = load_transformer(Path({str(random_llama_dir)!r}), torch.float32)\n"
        "assert model.inv_freq.device.type == 'cpu' and not model.model.embed_tokens.weight.is_meta\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_a_model_built_on_the_meta_device_holds_no_memory_but_its_rotary_table() -> None:
    args = ModelArgs.from_hf_config({
        "model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": 4, "num_key_value_heads": 2,
    })  # fmt: skip
    with torch.device("meta"):
        model = Transformer(args)
    assert all(p.is_meta for p in model.parameters())
    assert torch.equal(model.inv_freq, inverse_frequencies(args.head_dim, args.rope_theta, args.rope_scaling))
    torch.manual_seed(0)
    plain = Transformer(args).model.embed_tokens.weight
    torch.manual_seed(0)
    assert torch.equal(plain, torch.nn.Embedding(64, 32).weight)  # off the meta device: nn.Embedding's own init
