"""The attention link: a decode worker offloads each layer's attention to the attention
workers of its group (Lamina). Per step and micro-batch the decode worker sends the chunk
layout once (STEP); per layer it sends the new tokens' q, k, v for the worker's heads (QKV)
and gets the attention output back (OUT). KV of offloaded requests never crosses this link
except as those new tokens' k, v: it lives on the attention workers.

Modules: `wire` (frames), `client` (the decode side), `server` (the attention side).
"""
