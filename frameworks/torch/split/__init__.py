"""``dlcomm.torch.split``: split fine-tuning of a ``torch.nn.Module`` between edge ranks and a
cloud rank (SFT; docs/split.md). ``SplitModel`` cuts the model and runs the two sides;
``cut_module`` is the cut alone (what crosses, what was rerouted or eliminated)."""
from dlcomm.torch.split.cut import LINK_POLICIES, Cut, cut_module, parts_cut
from dlcomm.torch.split.model import SplitModel, micro_batches

__all__ = ["LINK_POLICIES", "Cut", "SplitModel", "cut_module", "micro_batches", "parts_cut"]
