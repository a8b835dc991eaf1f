"""Message tags of the point-to-point collectives, one per algorithm and phase.

Every algorithm sends with its own tag, so a message of one collective can never be
matched by a receive of another that runs on the same communicator (for example a
hierarchical all-reduce whose leader step uses the ring while a ring call is unfinished
on another rank). Values stay below 32767, the smallest ``MPI_TAG_UB`` the standard allows.
"""
from __future__ import annotations

import enum


class CollectiveTag(enum.IntEnum):
    """The tag each algorithm phase sends and receives with."""

    RING_REDUCE_SCATTER = 21001
    RING_ALLGATHER = 21002
    RHD_FOLD = 21011          # extra ranks hand their data to a partner (non power of two)
    RHD_REDUCE_SCATTER = 21012
    RHD_ALLGATHER = 21013
    RHD_UNFOLD = 21014        # partners hand the result back to the extra ranks
    TREE_REDUCE = 21021
    TREE_BROADCAST = 21022
    # pipelined: one tag per segment index k (tag + k, k < 64), so a segment's message can
    # only meet that segment's receive whatever order the receives are posted in
    PIPELINED_SCATTER = 21100  # every rank's copy of segment k to the block's owner
    PIPELINED_GATHER = 21200  # the reduced segment k from the block's owner to every rank
