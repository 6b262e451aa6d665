"""The torchrec extra: the scenario's pooled tables as a TorchRec EmbeddingBagCollection give
exactly the executor's pooled lookups."""

from __future__ import annotations

import torch
import torchrec  # the README's test command installs the torchrec extra: no silent skip here

import scenarios
from executor.data import SyntheticData
from executor.model import PooledTables
from executor.sparse import ebc_configs, pooled_kjt


def test_embedding_bag_collection_matches_pooled_tables():
    s = scenarios.load("debug-cpu")
    ours = PooledTables(s.model.embeddings)
    ebc = torchrec.EmbeddingBagCollection(tables=ebc_configs(s.model.embeddings))
    with torch.no_grad():
        for name, table in ours.tables.items():
            ebc.embedding_bags[name].weight.copy_(table.weight)
    batch = next(SyntheticData(s, 0))
    expected = ours(batch)
    got = ebc(pooled_kjt(batch)).to_dict()
    assert set(got) == set(expected) == {"user_0", "user_1", "user_2", "ad_0", "ad_1"}
    for name in expected:  # index by key: TorchRec's output order follows its own layout
        torch.testing.assert_close(got[name], expected[name])
