"""The scenario's pooled tables as TorchRec configs and inputs (the ``torchrec`` extra).

The single-device model (``model.PooledTables``) uses plain ``nn.EmbeddingBag``; the ``torchrec``
backend (``executor.torchrec_tables``) shards them over ``sparse_shard`` with TorchRec, which
needs the same tables as ``EmbeddingBagConfig``s and the batch as a ``KeyedJaggedTensor``.
Importing this module needs torchrec; nothing else in the executor does.
"""

from __future__ import annotations

import torch
from torchrec import EmbeddingBagConfig, KeyedJaggedTensor, PoolingType

from executor.data import Batch
from scenarios.schema import Embeddings


def ebc_configs(embeddings: Embeddings) -> list[EmbeddingBagConfig]:
    """One sum-pooled ``EmbeddingBagConfig`` per pooled table, feature named like the table."""
    return [
        EmbeddingBagConfig(name=name, embedding_dim=fam.dim, num_embeddings=fam.rows,
                           feature_names=[name], pooling=PoolingType.SUM)
        for fam in embeddings.pooled for name in fam.table_names()
    ]  # fmt: skip


def pooled_kjt(batch: Batch) -> KeyedJaggedTensor:
    """The batch's pooled ids as a ``KeyedJaggedTensor`` (keys in the batch's table order)."""
    keys = list(batch.pooled)
    values = torch.cat([batch.pooled[k][0] for k in keys])
    lengths = torch.cat([batch.pooled[k][1].diff() for k in keys])
    return KeyedJaggedTensor(keys=keys, values=values, lengths=lengths)
