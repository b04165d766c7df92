"""The wire between the grader and the worker (boundary/protocol.py, refs.py): plain data and
markers round-trip, pickled objects and oversized messages are refused."""
from pathlib import Path

import pytest
import torch

from autograder.boundary.protocol import (MAX_MESSAGE, HEADER, ProtocolError, decode, encode,
                                         read_message)
from autograder.boundary.refs import CacheRef, Handle, ModelRef, from_wire, to_wire
from autograder.boundary.store import ReferenceStore


def test_protocol_round_trip_of_plain_data_and_markers():
    store = ReferenceStore()
    refs = to_wire([ModelRef("tiny", 3), CacheRef(3, 16), Handle(7)], store.register)
    value = {"t": torch.arange(6).reshape(2, 3)[:, 1], "xs": [1, 2.5, "s", None, (True,)],
             "refs": refs}
    data = encode(value)
    (size,) = HEADER.unpack(data[:HEADER.size])
    back = decode(data[HEADER.size:])
    assert size == len(data) - HEADER.size
    assert torch.equal(back["t"], torch.tensor([1, 4])) and back["xs"] == value["xs"]
    assert from_wire(back["refs"][2]) == Handle(7)
    model, cache = from_wire(back["refs"][:2])
    assert (model.kind, cache.kind) == ("model", "cache") and store.get(cache).max_len == 16
    with pytest.raises(TypeError, match="store"):
        to_wire(ModelRef("tiny", 3))
    with pytest.raises(ValueError, match="unexpected marker"):
        from_wire({"__autograder__": "model"})


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_protocol_refuses_pickled_objects_and_oversized_messages():
    import io
    import pickle
    with pytest.raises(ProtocolError, match="unreadable"):
        decode(pickle.dumps(Path("/etc/passwd")))
    buffer = io.BytesIO()
    torch.save({"obj": Path("/")}, buffer)  # an arbitrary object inside torch.save
    with pytest.raises(ProtocolError):
        decode(buffer.getvalue())
    read_fd, write_fd = __import__("os").pipe()
    __import__("os").write(write_fd, HEADER.pack(MAX_MESSAGE + 1))
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        read_message(read_fd)



def test_the_trace_sees_a_rollback_written_by_position():
    """A forward given ``positions`` with a cache writes by position (the model cuts a longer
    cache back to positions[0]): the trace records the length kept, as a truncate would, so that
    a rollback by position is judged as one."""
    store = ReferenceStore()
    model = store.get(from_wire(to_wire(ModelRef("tiny", 3), store.register)))
    for cut in ("truncate", "positions"):
        cache = model.new_cache(batch=1, max_len=16)
        store._model_forward(model, torch.tensor([[5, 6, 7, 8]]), cache=cache)
        if cut == "truncate":
            cache.truncate(2)
            store._model_forward(model, torch.tensor([[9]]), cache=cache)
        else:
            store._model_forward(model, torch.tensor([[9]]), torch.tensor([2]), cache=cache)
        assert [f.cache_length for f in store.trace[-2:]] == [0, 2], (cut, store.trace[-2:])
        assert cache.length == 3
