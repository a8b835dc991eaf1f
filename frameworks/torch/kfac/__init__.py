"""``dlcomm.torch.kfac``: distributed K-FAC for torch models (docs/kfac.md).

``from dlcomm.torch.kfac import KFACPreconditioner``; arguments and usage mirror
kfac-pytorch's, with factors all-reduced through dlcomm's engine as the pass produces them
and inversions balanced over ranks by cost.
"""
from dlcomm.kfac.strategy import DistributedStrategy
from dlcomm.torch.kfac.layers import Conv2dLayer, KFACLayer, LinearLayer
from dlcomm.torch.kfac.preconditioner import KFACPreconditioner

__all__ = ["Conv2dLayer", "DistributedStrategy", "KFACLayer", "KFACPreconditioner",
           "LinearLayer"]
