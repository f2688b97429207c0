"""`ninfer convert SRC -o OUT.ninfer`: a Hugging Face directory or a GGUF file to .ninfer.

`ninfer convert SRC.ninfer --mtp-head HEAD.safetensors -o OUT.ninfer` attaches a separately
trained MTP head (`mtp.*` tensors) as the artifact's mtp component (ninfer/artifact/attach.py).

`--dflash DIR` attaches a DFlash drafter in its published Hugging Face layout (config.json +
safetensors, e.g. z-lab/Qwen3-8B-DFlash-b16) as the dflash component, to the model converted
from SRC or to SRC.ninfer itself (ninfer/artifact/dflash.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ninfer.artifact.quant import WEIGHT_FORMATS
from ninfer.errors import ConfigError, ConvertError
from ninfer.ir.models import check_tensors


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", help="Hugging Face model directory or .gguf file")
    p.add_argument("-o", "--output", required=True, metavar="OUT.ninfer", help="artifact to write")
    p.add_argument(
        "--weights",
        choices=WEIGHT_FORMATS,
        help="quantise projection weights to this storage format",
    )
    p.add_argument(
        "--quantize-lm-head",
        action="store_true",
        help="quantise the LM head to --weights too (default: it stays bf16)",
    )
    p.add_argument(
        "--name", help="metadata.name stored in the artifact (the default public model id)"
    )
    p.add_argument(
        "--chat-template",
        metavar="FILE",
        help="Jinja chat template to store instead of the source's",
    )
    p.add_argument(
        "--mtp-head",
        metavar="HEAD.safetensors",
        help="with a .ninfer SRC: attach this MTP head (mtp.* tensors) as its mtp component",
    )
    p.add_argument(
        "--dflash",
        metavar="DIR",
        help="attach this DFlash drafter (its Hugging Face directory) as the dflash component "
        "(--spec dflash); SRC may be a model to convert or a .ninfer",
    )
    p.add_argument(
        "--generation-defaults",
        metavar="NAME=VALUE,...",
        help="sampling defaults to record, over the source's (generation_config.json, GGUF "
        "general.sampling.*): temperature, top_p, top_k, min_p, presence_penalty, "
        "frequency_penalty; e.g. temperature=0.2,top_p=0.9",
    )


def run(args: argparse.Namespace) -> int:
    src, out = Path(args.src), Path(args.output)
    if args.name is not None and not args.name.strip():
        raise ConvertError("--name must not be empty (leave it out for the source's name)")
    template = None
    if args.chat_template:
        try:
            template = Path(args.chat_template).read_text(encoding="utf-8")
        except OSError as e:
            raise ConvertError(
                f"--chat-template {args.chat_template}: cannot read ({e.strerror})"
            ) from None
        from ninfer.api.service.template import ChatTemplate

        try:  # refused now rather than when `ninfer serve` loads the artifact
            ChatTemplate(template)
        except ConfigError as e:
            raise ConvertError(f"--chat-template {args.chat_template}: {e}") from None
    generation = None
    if args.generation_defaults is not None:
        from ninfer.artifact.generation import parse_defaults

        try:
            generation = parse_defaults(args.generation_defaults)
        except ValueError as e:
            raise ConvertError(str(e)) from None
    if not src.exists():
        raise ConvertError(f"{src}: no such file or directory")
    if Path(out).is_dir():
        raise ConvertError(f"-o {out}: is a directory; name the .ninfer file to write")
    if args.dflash is not None and not Path(args.dflash).is_dir():
        raise ConvertError(
            f"--dflash {args.dflash}: not a directory (the drafter's Hugging Face directory)"
        )
    if args.dflash is not None and src.suffix == ".ninfer":
        return _attach_dflash(args, src, out)
    if args.mtp_head is not None or src.suffix == ".ninfer":
        return _attach(args, src, out)
    options = {
        "weights": args.weights,
        "name": args.name,
        "chat_template": template,
        "progress": True,
        "quantize_lm_head": args.quantize_lm_head,
        "generation": generation,
        "check_model": check_tensors,
    }
    if src.is_file() and src.suffix.lower() != ".gguf":
        raise ConvertError(f"{src}: not a .gguf file or a Hugging Face model directory")
    from ninfer.artifact.cache import sigterm_unwinds

    with sigterm_unwinds():  # a terminated conversion removes its temporary file, as Ctrl-C does
        if src.is_file():
            from ninfer.artifact.convert_gguf import convert_gguf

            convert_gguf(src, out, **options)
        else:
            from ninfer.artifact.convert_hf import convert_hf

            convert_hf(src, out, **options)
        if args.dflash is not None:
            from ninfer.artifact.dflash import attach_dflash

            attach_dflash(out, args.dflash, out)
    print(f"wrote {out}", file=sys.stderr)
    return 0


def _attach_dflash(args: argparse.Namespace, src: Path, out: Path) -> int:
    """SRC.ninfer --dflash DIR: the artifact with the drafter attached (no other option)."""
    given = [f for f in ("weights", "chat_template", "generation_defaults", "mtp_head", "name")]
    given = [f for f in given if getattr(args, f)]
    if given or args.quantize_lm_head:
        flags = [f"--{f.replace('_', '-')}" for f in given] or ["--quantize-lm-head"]
        raise ConvertError(f"{', '.join(flags)}: not applied when attaching a DFlash drafter")
    from ninfer.artifact.cache import sigterm_unwinds
    from ninfer.artifact.dflash import attach_dflash

    with sigterm_unwinds():
        attach_dflash(src, args.dflash, out)
    print(f"wrote {out}", file=sys.stderr)
    return 0


def _attach(args: argparse.Namespace, src: Path, out: Path) -> int:
    """SRC.ninfer --mtp-head HEAD: the artifact with the head attached (no other option)."""
    if args.mtp_head is None or src.suffix != ".ninfer":
        raise ConvertError(
            "--mtp-head goes with a .ninfer SRC (an artifact to attach the head to)"
            if args.mtp_head is not None
            else f"{src}: already an artifact; give --mtp-head HEAD.safetensors to attach a head"
        )
    given = [f for f in ("weights", "chat_template", "generation_defaults") if getattr(args, f)]
    if given or args.quantize_lm_head:
        flags = [f"--{f.replace('_', '-')}" for f in given] or ["--quantize-lm-head"]
        raise ConvertError(f"{', '.join(flags)}: not applied when attaching an MTP head")
    if not Path(args.mtp_head).is_file():
        raise ConvertError(f"--mtp-head {args.mtp_head}: no such file")
    from ninfer.artifact.attach import attach_mtp, read_head

    attach_mtp(src, read_head(Path(args.mtp_head)), out, check_tensors, args.name)
    print(f"wrote {out}", file=sys.stderr)
    return 0
