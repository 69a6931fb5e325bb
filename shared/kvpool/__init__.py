"""The KV block pool: its protocol (`pool.py`), the kvstore client and Mooncake Store
behind it, asking a source for blocks, the hash ring that names each block's owner, the
events the pool publishes and the header every stored block carries."""
