"""Input-pipeline support: a multi-level cache of decoded samples shared by a host's ranks
(framework-free; ``dlcomm.torch.data`` wraps a torch ``Dataset``)."""
from dlcomm.data.sample_cache import CacheStats, SampleCache

__all__ = ["CacheStats", "SampleCache"]
