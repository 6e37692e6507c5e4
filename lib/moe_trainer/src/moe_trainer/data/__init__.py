"""Data for the trainer: the token cache format, the Feistel data order, and the batch loaders."""

from moe_trainer.data.cache import CacheHeader, CacheWriter, DomainStats, TokenCache, write_shard
from moe_trainer.data.loader import EvalLoader, Prefetcher, TrainLoader
from moe_trainer.data.permutation import FeistelPermutation, feistel_permutation

__all__ = ["CacheHeader", "CacheWriter", "DomainStats", "EvalLoader", "FeistelPermutation", "Prefetcher",
           "TokenCache", "TrainLoader", "feistel_permutation", "write_shard"]
