"""vLLM 0.32's hidden-states connector on a machine without CUDA (the serving tier's capture).

`ExampleHiddenStatesConnector._submit_async_write`
(`vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py`) stages the
device-to-host copy of the extracted hidden states through a CUDA copy stream, two CUDA events
and pinned host memory, whatever the device: on a CPU-only machine the first
`torch.empty_like(..., pin_memory=True)` raises "Found no NVIDIA driver on your system". On CPU
that copy is the identity, so here, in every process of the capture (this file is imported at
start-up through PYTHONPATH, the engine's worker processes included), when CUDA is absent:

- `torch.cuda.Stream`, `torch.cuda.Event` and `torch.cuda.stream` are objects that do nothing
  (a stream to wait on, an event that is already complete);
- `torch.empty_like` ignores `pin_memory`.

vLLM's own CPU worker (`vllm/v1/worker/cpu/shm.py`) already puts placeholders in for CUDA's
streams and events, but its `_EventPlaceholder` has no `query()`, which the connector's
`get_finished` calls: the placeholder gets one that says "complete" when that module loads.

Nothing else changes: the `extract_hidden_states` method, which taps the layers into the KV
cache, `extract_from_kv_cache`, and the file the connector writes are vLLM's own. Used only by
tests/engines/serve.sh; never part of kquant.
"""

import contextlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from patch_on_import import after_import  # noqa: E402


def _install():
    try:
        import torch
    except Exception:  # not the engine's venv: nothing to do
        return
    if torch.cuda.is_available():
        return

    class Stream:
        def __init__(self, *a, **k):
            pass

        def wait_event(self, *a, **k):
            pass

        def wait_stream(self, *a, **k):
            pass

        def synchronize(self):
            pass

    class Event:
        def __init__(self, *a, **k):
            pass

        def record(self, *a, **k):
            pass

        def synchronize(self):
            pass

        def wait(self, *a, **k):
            pass

        def query(self):
            return True

    torch.cuda.Stream = Stream
    torch.cuda.Event = Event
    torch.cuda.stream = lambda s=None: contextlib.nullcontext()
    empty_like = torch.empty_like

    def empty_like_unpinned(*a, **k):
        k.pop("pin_memory", None)
        return empty_like(*a, **k)

    torch.empty_like = empty_like_unpinned
    # vLLM's CPU event placeholder gets the `query()` the connector calls.
    after_import("vllm.v1.worker.cpu.shm", _event_query)


def _event_query(module):
    module._EventPlaceholder.query = lambda self: True


_install()
