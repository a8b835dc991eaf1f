"""``dlcomm.torch.sync.BalancedBatchSampler``, the documented place of LB-BSP's sampler (the
class lives in ``dlcomm.torch.heterogeneity.lbbsp``; ``hvd.BalancedBatchSampler`` is the same)."""
from dlcomm.torch.heterogeneity.lbbsp import BalancedBatchSampler

__all__ = ["BalancedBatchSampler"]
