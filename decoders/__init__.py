"""Decoding backends behind one contract: `make_decoder(name, target, **opts).generate(request)`."""
from decoders.base import (
    Decoder,
    DecoderError,
    GenerationRequest,
    GenerationResult,
    Timing,
    decoder_names,
    get_decoder_class,
    make_decoder,
    register_decoder,
)

__all__ = [
    "Decoder", "DecoderError", "GenerationRequest", "GenerationResult", "Timing",
    "decoder_names", "get_decoder_class", "make_decoder", "register_decoder",
]
