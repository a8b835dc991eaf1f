"""Split fine-tuning for edge and cloud (SFT, Shi et al.): the framework-free parts.

A model is cut in two: the first part runs on edge ranks that hold the data, the rest on a
cloud rank. Each step the edge sends the activation at the cut, the cloud sends back its
gradient (``protocol``), over the transport's point-to-point messages (``link``). Codecs
shrink both: per-batch low-rank factors (``lowrank``), top-k (``topk``), float16, and a
per-sample memory (``memory``) that corrects what they leave out. ``dlcomm.torch.split`` is
the torch front end that cuts a ``torch.nn.Module`` and runs the two sides.
"""
from dlcomm.split.codec import Codec, Encoded, Float16Codec, NoneCodec, SideCodec
from dlcomm.split.link import LinkError, SplitLink
from dlcomm.split.lowrank import LowRankCodec
from dlcomm.split.memory import SampleMemory
from dlcomm.split.protocol import Flag, Kind, Message, Slot, message_nbytes, pack, unpack
from dlcomm.split.registry import available_codecs, get_codec, parse_codec_spec
from dlcomm.split.roles import Roles, check_agreement, make_roles
from dlcomm.split.topk import TopKCodec

__all__ = [
    "Codec", "Encoded", "Flag", "Float16Codec", "Kind", "LinkError", "LowRankCodec", "Message",
    "NoneCodec", "Roles", "SampleMemory", "SideCodec", "Slot", "SplitLink", "TopKCodec",
    "available_codecs", "check_agreement", "get_codec", "make_roles", "message_nbytes", "pack",
    "parse_codec_spec", "unpack",
]
